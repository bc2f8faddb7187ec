-- End a session of a previous life of its node as lost, and answer the calls it was sent that
-- have no terminal event: the node died and came back under its name, so its new life never
-- reads them (it reads its calls stream from the end) and their callers, who see its
-- heartbeat again, would wait out their timeouts.
--
-- KEYS[1] session hash   KEYS[2] live sessions (sorted set)
-- KEYS[3..] the event streams of calls sent to the session before the node's start
-- ARGV[1] session id   ARGV[2] the node   ARGV[3] now (Unix ms)
-- ARGV[4] how long the ended hash lives, in seconds, when the hash does not say (field
-- result_ttl_s)   ARGV[5] the terminal event JSON each unanswered call gets
-- ARGV[6] how long a call's events live, in ms
--
-- Touches nothing unless the hash names ARGV[2] and is live (then it is ended, reason lost) or
-- was ended lost already (by a caller's check). A call whose last event is a result or an
-- error was answered, and gets nothing. Returns the number of calls answered.
if redis.call('HGET', KEYS[1], 'node') ~= ARGV[2] then
  return 0
end
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'ended' then
  if redis.call('HGET', KEYS[1], 'reason') ~= 'lost' then
    return 0
  end
else
  redis.call('HSET', KEYS[1], 'state', 'ended', 'reason', 'lost', 'ended_ms', ARGV[3])
  redis.call('ZREM', KEYS[2], ARGV[1])
  local ttl = tonumber(redis.call('HGET', KEYS[1], 'result_ttl_s') or ARGV[4]) or 86400
  redis.call('EXPIRE', KEYS[1], ttl)
end
local answered = 0
for i = 3, #KEYS do
  local last = redis.call('XREVRANGE', KEYS[i], '+', '-', 'COUNT', 1)[1]
  local terminal = false
  if last then
    local fields = last[2]
    for j = 1, #fields, 2 do
      if fields[j] == 'event' then
        local ok, event = pcall(cjson.decode, fields[j + 1])
        if ok and type(event) == 'table' and (event.kind == 'result' or event.kind == 'error') then
          terminal = true
        end
      end
    end
  end
  if not terminal then
    redis.call('XADD', KEYS[i], '*', 'event', ARGV[5])
    redis.call('PEXPIRE', KEYS[i], ARGV[6])
    answered = answered + 1
  end
end
return answered
