-- Enqueue one job unless its id is already pending or its result is still alive.
--
-- KEYS[1] jobs stream   KEYS[2] idem marker   KEYS[3] result   KEYS[4] batch hash
-- ARGV[1] job JSON      ARGV[2] marker/batch TTL in seconds
-- ARGV[3] '1' when the job counts towards the batch in KEYS[4]
--
-- KEYS[5] cancels made ahead (sorted set, score = when each lapses, Unix ms)
-- KEYS[6] cancelled ids   ARGV[4] job id   ARGV[5] now (Unix ms)
-- ARGV[6] 'PUBLISH', or 'SPUBLISH' in a Redis Cluster   ARGV[7] cancel channel
-- (KEYS[5..6] and ARGV[4..7] come together, and may be left out: a client that leaves them
-- out does not apply cancels made ahead of its jobs.)
--
-- Returns {1, entry id} when the job was added, {0, entry id of the first copy or ''} when not.
if redis.call('EXISTS', KEYS[3]) == 1 then
  return {0, ''}
end
local first = redis.call('GET', KEYS[2])
if first then
  return {0, first}
end
-- A live cancel made ahead of this id becomes a cancel of this job, published before its
-- entry exists, so no worker starts it.
if KEYS[6] then
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', ARGV[5])
  if redis.call('ZREM', KEYS[5], ARGV[4]) == 1 then
    if ARGV[6] ~= 'PUBLISH' and ARGV[6] ~= 'SPUBLISH' then
      return redis.error_reply('ERR ARGV[6] must be PUBLISH or SPUBLISH')
    end
    redis.call('ZADD', KEYS[6], ARGV[5], ARGV[4])
    redis.call(ARGV[6], ARGV[7], ARGV[4])
  end
end
-- 'vetted': no pending copy and no live result, so a fresh read need not check again.
local entry = redis.call('XADD', KEYS[1], '*', 'job', ARGV[1], 'vetted', '1')
redis.call('SET', KEYS[2], entry, 'EX', ARGV[2])
if ARGV[3] == '1' then
  redis.call('HINCRBY', KEYS[4], 'total', 1)
  redis.call('EXPIRE', KEYS[4], ARGV[2])
end
return {1, entry}
