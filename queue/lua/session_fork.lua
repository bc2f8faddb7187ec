-- Record the branches of a session's fork: each a live session of the parent's node, with
-- its parent named; the parent's hash lists its children.
--
-- KEYS[1] parent's hash   KEYS[2] live sessions (sorted set)   KEYS[3..] the branches' hashes
-- ARGV[1] parent's id     ARGV[2] the node   ARGV[3] the branches' end of life (Unix ms)
-- ARGV[4] n, the number of branches   ARGV[5..] the branches' ids, then their hashes' fields,
-- name value ...
--
-- Only the node the parent's hash names, while the parent is live, may record its branches.
-- Returns 1 when they are recorded, 0 when the parent is no longer this node's live session
-- (the node then ends the branches it made).
if redis.call('HGET', KEYS[1], 'node') ~= ARGV[2] or redis.call('HGET', KEYS[1], 'state') ~= 'live' then
  return 0
end
local n = tonumber(ARGV[4])
local fields = {}
for i = 5 + n, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
local children = redis.call('HGET', KEYS[1], 'children')
for i = 1, n do
  local sid = ARGV[4 + i]
  redis.call('DEL', KEYS[2 + i])
  redis.call('HSET', KEYS[2 + i], 'parent', ARGV[1], unpack(fields))
  redis.call('ZADD', KEYS[2], ARGV[3], sid)
  if children and children ~= '' then
    children = children .. ',' .. sid
  else
    children = sid
  end
end
redis.call('HSET', KEYS[1], 'children', children)
return 1
