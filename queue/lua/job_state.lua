-- Where a job is: {'finished', status}, {'running', consumer}, {'queued', ''} or
-- {'unknown', ''}. Read-only.
--
-- KEYS[1] result   KEYS[2] done list   KEYS[3] idem marker   KEYS[4] jobs stream
-- ARGV[1] job id   ARGV[2] group
--
-- A job is found through the idempotency marker the enqueue script sets, or, for one added
-- with a raw XADD and no id of its own, by its id as a stream entry id. One a raw XADD added
-- with an id of its own is 'unknown' until its result exists. 'running' means delivered and
-- not yet acknowledged: its consumer may have died and the entry wait to be reclaimed.
if redis.call('EXISTS', KEYS[1]) == 1 then
  local status = redis.pcall('LINDEX', KEYS[2], -1)
  return {'finished', type(status) == 'string' and status or ''}
end
local entry = redis.pcall('GET', KEYS[3])
if type(entry) ~= 'string' then
  entry = string.match(ARGV[1], '^%d+%-%d+$')
end
if not entry or #redis.call('XRANGE', KEYS[4], entry, entry) == 0 then
  return {'unknown', ''}
end
local pending = redis.pcall('XPENDING', KEYS[4], ARGV[2], entry, entry, 1)
if type(pending) == 'table' and type(pending[1]) == 'table' then
  return {'running', pending[1][2]}
end
return {'queued', ''}
