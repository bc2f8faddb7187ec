-- Send a call to a session's node, after checking the session is live and its node answers.
--
-- KEYS[1] session hash   KEYS[2] calls stream of the session's node   KEYS[3] that node's heartbeat
-- KEYS[4] the call's event stream   KEYS[5] live sessions (sorted set)
-- ARGV[1] call JSON ('' checks the session alone: a waiter's check of a lost node)
-- ARGV[2] the node the caller read from the hash   ARGV[3] calls stream MAXLEN
-- ARGV[4] now (Unix ms)   ARGV[5] session id   ARGV[6] how long an ended session's hash lives,
-- in seconds, when the hash does not say (field result_ttl_s)
--
-- Returns {'ok', entry id} ({'ok', ''} for a check), or {code, message} with code:
-- 'unknown' (no such session), 'ended' (message 'session ended: <reason>'), 'lost' (the
-- node's heartbeat is gone: the session is marked ended, reason lost), 'moved' (the hash names
-- another node than ARGV[2]: read it again), 'taken' (the call id has events already).
local node = redis.call('HGET', KEYS[1], 'node')
if not node then
  return {'unknown', 'unknown session'}
end
if node ~= ARGV[2] then
  return {'moved', 'the session is on node ' .. node}
end
if redis.call('HGET', KEYS[1], 'state') == 'ended' then
  local reason = redis.call('HGET', KEYS[1], 'reason') or 'unknown'
  return {'ended', 'session ended: ' .. reason}
end
if redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('HSET', KEYS[1], 'state', 'ended', 'reason', 'lost', 'ended_ms', ARGV[4])
  redis.call('ZREM', KEYS[5], ARGV[5])
  local ttl = tonumber(redis.call('HGET', KEYS[1], 'result_ttl_s') or ARGV[6]) or 86400
  redis.call('EXPIRE', KEYS[1], ttl)
  return {'lost', 'session lost: node ' .. node .. ' stopped answering'}
end
if ARGV[1] == '' then
  return {'ok', ''}
end
if redis.call('EXISTS', KEYS[4]) == 1 then
  return {'taken', 'call id already used'}
end
local entry = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', 'call', ARGV[1])
return {'ok', entry}
