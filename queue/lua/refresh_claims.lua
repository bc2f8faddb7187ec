-- Reset the idle time of entries this consumer still owns, without bumping delivery counts.
-- An entry another worker has reclaimed meanwhile is left alone: stealing it back would run
-- the job twice at once.
--
-- KEYS[1] jobs stream   ARGV[1] group   ARGV[2] consumer   ARGV[3..] entry ids
-- Returns the entry ids the consumer no longer owns (reclaimed elsewhere or acknowledged).
local lost = {}
for i = 3, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if #p == 1 and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
  else
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
