-- End a session: its node records the end and ends every call in flight or queued.
--
-- KEYS[1] session hash   KEYS[2] live sessions (sorted set)
-- KEYS[3..] the event streams of the calls in flight or queued
-- ARGV[1] session id     ARGV[2] the node ending it   ARGV[3] reason   ARGV[4] now (Unix ms)
-- ARGV[5] how long the ended hash lives, in seconds
-- ARGV[6] the terminal event JSON each call gets   ARGV[7] how long a call's events live, in ms
--
-- Only the node the hash names may end the session. Returns 1 when this call ended it, 0 when
-- it was ended already (by the lost check of a caller) or is another node's; the calls get
-- their terminal event either way, so none of their callers waits on.
for i = 3, #KEYS do
  redis.call('XADD', KEYS[i], '*', 'event', ARGV[6])
  redis.call('PEXPIRE', KEYS[i], ARGV[7])
end
if redis.call('HGET', KEYS[1], 'node') ~= ARGV[2] then
  return 0
end
local was = redis.call('HGET', KEYS[1], 'state')
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[5])
if was == 'ended' then
  return 0
end
redis.call('HSET', KEYS[1], 'state', 'ended', 'reason', ARGV[3], 'ended_ms', ARGV[4])
return 1
