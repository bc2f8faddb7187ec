-- Enqueue one job unless its id is already pending or its result is still alive.
--
-- KEYS[1] jobs stream   KEYS[2] idem marker   KEYS[3] batch hash
-- ARGV[1] job JSON      ARGV[2] marker/batch TTL in seconds
-- ARGV[3] '1' when the job counts towards the batch in KEYS[3]
--
-- KEYS[4] cancels made ahead (sorted set, score = when each lapses, Unix ms)
-- KEYS[5] cancelled ids   ARGV[4] job id   ARGV[5] now (Unix ms)
-- ARGV[6] 'PUBLISH', or 'SPUBLISH' in a Redis Cluster   ARGV[7] cancel channel
-- (KEYS[4..5] and ARGV[4..7] come together, and may be left out: a client that leaves them
-- out does not apply cancels made ahead of its jobs.)
--
-- The marker lives while the job is pending and then as long as its result (the completion
-- script sets it, for an entry added by a raw XADD too), so it alone says whether the id is
-- taken: the script never touches the result key, which a submitter may not write (every key
-- a script is given must be writable by the caller's ACL user).
--
-- Returns {1, entry id} when the job was added, {0, entry id of the first copy} when not.
local first = redis.call('GET', KEYS[2])
if first then
  return {0, first}
end
-- A live cancel made ahead of this id becomes a cancel of this job, published before its
-- entry exists, so no worker starts it.
if KEYS[5] then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', ARGV[5])
  if redis.call('ZREM', KEYS[4], ARGV[4]) == 1 then
    if ARGV[6] ~= 'PUBLISH' and ARGV[6] ~= 'SPUBLISH' then
      return redis.error_reply('ERR ARGV[6] must be PUBLISH or SPUBLISH')
    end
    redis.call('ZADD', KEYS[5], ARGV[5], ARGV[4])
    redis.call(ARGV[6], ARGV[7], ARGV[4])
  end
end
-- 'vetted': no pending copy and no live result, so a fresh read need not check again.
local entry = redis.call('XADD', KEYS[1], '*', 'job', ARGV[1], 'vetted', '1')
redis.call('SET', KEYS[2], entry, 'EX', ARGV[2])
if ARGV[3] == '1' then
  redis.call('HINCRBY', KEYS[3], 'total', 1)
  redis.call('EXPIRE', KEYS[3], ARGV[2])
end
return {1, entry}
