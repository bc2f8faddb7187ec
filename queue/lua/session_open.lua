-- Open a session: store its create job's result (status ok), retire the job's stream entry and
-- record the session as live, atomically. The result part is complete.lua's for a job without
-- batch or reply_to (a session's create job has neither).
--
-- KEYS[1] result        KEYS[2] done list      KEYS[3] results stream   KEYS[4] jobs stream
-- KEYS[5] idem marker   KEYS[6] wake stream    KEYS[7] session hash     KEYS[8] live sessions
-- ARGV[1] result JSON   ARGV[2] TTL in seconds   ARGV[3] results MAXLEN   ARGV[4] group
-- ARGV[5] entry id      ARGV[6] how long the wake stream outlives the completion, in ms
-- ARGV[7] session id    ARGV[8] the session's end of life (Unix ms, the sorted set's score)
-- ARGV[9..] the session hash's fields, name value ...
--
-- Fenced by delivery as complete.lua is: returns 1 when it stored the result and the session
-- is live; 0 when nothing was stored (the entry was no longer pending, or a result exists:
-- the node must close the sandbox it opened); 2 when neither the entry nor a result exists.
local function wrong_type(key, kind)
  local t = redis.call('TYPE', key).ok
  if t ~= 'none' and t ~= kind then
    return redis.error_reply('WRONGTYPE ' .. key .. ' holds a ' .. t .. ', not a ' .. kind), t
  end
  return nil, t
end
local refused, result_type = wrong_type(KEYS[1], 'string')
refused = refused or wrong_type(KEYS[2], 'list') or wrong_type(KEYS[3], 'stream')
  or wrong_type(KEYS[6], 'stream') or wrong_type(KEYS[7], 'hash')
  or wrong_type(KEYS[8], 'zset')
if refused then
  return refused
end
if redis.call('XACK', KEYS[4], ARGV[4], ARGV[5]) == 0 then
  if result_type == 'none' then
    return 2
  end
  return 0
end
redis.call('XDEL', KEYS[4], ARGV[5])
if result_type ~= 'none' then
  return 0
end
local ttl = ARGV[2]
redis.call('SET', KEYS[1], ARGV[1], 'EX', ttl)
redis.call('RPUSH', KEYS[2], 'ok')
redis.call('EXPIRE', KEYS[2], ttl)
redis.call('XADD', KEYS[6], '*', 'status', 'ok')
redis.call('PEXPIRE', KEYS[6], ARGV[6])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'result', ARGV[1])
if redis.call('EXPIRE', KEYS[5], ttl) == 0 then
  redis.call('SET', KEYS[5], ARGV[5], 'EX', ttl)
end
local fields = {}
for i = 9, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
redis.call('DEL', KEYS[7])
redis.call('HSET', KEYS[7], unpack(fields))
redis.call('ZADD', KEYS[8], ARGV[8], ARGV[7])
return 1
