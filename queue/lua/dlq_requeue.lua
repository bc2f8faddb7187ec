-- Move one dead letter back onto the job stream.
--
-- KEYS[1] dead stream   KEYS[2] jobs stream   KEYS[3] result   KEYS[4] done list
-- KEYS[5] batch hash    KEYS[6] idem marker
-- ARGV[1] dead entry id   ARGV[2] raw job payload
-- ARGV[3] '1' when dead-lettering stored the result (it is then removed, so the job can run)
-- ARGV[4] '1' when the job belongs to the batch in KEYS[5]
--
-- Returns the new stream entry id, or false when the dead letter no longer exists.
if redis.call('XDEL', KEYS[1], ARGV[1]) == 0 then
  return false
end
if ARGV[3] == '1' then
  local old = redis.call('GET', KEYS[3])
  if old and ARGV[4] == '1' then
    local ok, r = pcall(cjson.decode, old)
    if ok and type(r) == 'table' and type(r.status) == 'string' then
      redis.pcall('HINCRBY', KEYS[5], 'done', -1)
      redis.pcall('HINCRBY', KEYS[5], r.status, -1)
    end
  end
  redis.call('DEL', KEYS[3], KEYS[4])
end
local entry = redis.call('XADD', KEYS[2], '*', 'job', ARGV[2])
if redis.call('EXISTS', KEYS[6]) == 1 then
  redis.call('SET', KEYS[6], entry, 'KEEPTTL')
end
return entry
