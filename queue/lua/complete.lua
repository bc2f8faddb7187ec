-- Store a job's result and retire its stream entry, atomically. Also used to dead-letter.
--
-- KEYS[1] result        KEYS[2] done list      KEYS[3] results stream   KEYS[4] batch hash
-- KEYS[5] jobs stream   KEYS[6] reply_to stream  KEYS[7] idem marker    KEYS[8] dead stream
-- ARGV[1] result JSON   ARGV[2] TTL in seconds   ARGV[3] results MAXLEN  ARGV[4] status
-- ARGV[5] group         ARGV[6] entry id         ARGV[7] '1' if batched  ARGV[8] '1' if reply_to
-- ARGV[9] dead MAXLEN   ARGV[10..] dead-letter fields, name value ...; none when completing
--
-- A result that already exists wins: the call is then a duplicate and only acknowledges.
-- Returns 1 when this call stored the result, 0 for a duplicate.
local stored = 0
if redis.call('EXISTS', KEYS[1]) == 0 then
  local ttl = ARGV[2]
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ttl)
  redis.call('RPUSH', KEYS[2], ARGV[4])
  redis.call('EXPIRE', KEYS[2], ttl)
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'result', ARGV[1])
  -- pcall: these keys are named by the job; a wrong type there must not abort the completion
  -- half-way (scripts do not roll back).
  if ARGV[7] == '1' then
    redis.pcall('HINCRBY', KEYS[4], 'done', 1)
    redis.pcall('HINCRBY', KEYS[4], ARGV[4], 1)
    redis.pcall('EXPIRE', KEYS[4], ttl)
  end
  if ARGV[8] == '1' then
    redis.pcall('XADD', KEYS[6], 'MAXLEN', '~', ARGV[3], '*', 'result', ARGV[1])
  end
  if redis.call('EXISTS', KEYS[7]) == 1 then
    redis.call('EXPIRE', KEYS[7], ttl)
  end
  stored = 1
end
if #ARGV > 9 then
  local fields = {}
  for i = 10, #ARGV do
    fields[#fields + 1] = ARGV[i]
  end
  fields[#fields + 1] = 'result_stored'
  fields[#fields + 1] = tostring(stored)
  redis.call('XADD', KEYS[8], 'MAXLEN', '~', ARGV[9], '*', unpack(fields))
end
redis.call('XACK', KEYS[5], ARGV[5], ARGV[6])
redis.call('XDEL', KEYS[5], ARGV[6])
return stored
