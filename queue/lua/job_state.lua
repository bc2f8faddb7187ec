-- Where a job is: {'finished', status}, {'running', consumer}, {'queued', ''} or
-- {'unknown', ''}. Read-only.
--
-- KEYS[1] idem marker   KEYS[2] jobs stream
-- ARGV[1] job id   ARGV[2] group   ARGV[3] result key   ARGV[4] done list (both in the same
-- slot as the keys)
--
-- The result key and the done list are read, never written, so they are not declared: Redis 7
-- checks every key a script is given against the caller's write rights, and a submitter may
-- read results and done lists but not write them (see the ACL roles in docs/operations.md).
--
-- A job is found through the idempotency marker the enqueue script sets, or, for one added
-- with a raw XADD and no id of its own, by its id as a stream entry id. One a raw XADD added
-- with an id of its own is 'unknown' until its result exists. 'running' means delivered and
-- not yet acknowledged: its consumer may have died and the entry wait to be reclaimed.
if redis.call('EXISTS', ARGV[3]) == 1 then
  local status = redis.pcall('LINDEX', ARGV[4], -1)
  return {'finished', type(status) == 'string' and status or ''}
end
local entry = redis.pcall('GET', KEYS[1])
if type(entry) ~= 'string' then
  entry = string.match(ARGV[1], '^%d+%-%d+$')
end
if not entry or #redis.call('XRANGE', KEYS[2], entry, entry) == 0 then
  return {'unknown', ''}
end
local pending = redis.pcall('XPENDING', KEYS[2], ARGV[2], entry, entry, 1)
if type(pending) == 'table' and type(pending[1]) == 'table' then
  return {'running', pending[1][2]}
end
return {'queued', ''}
