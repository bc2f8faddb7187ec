-- Hand entries back to the group at once: a worker that cannot run them (its sandbox is gone)
-- makes them look idle for a long time, so any worker's next reclaim takes them without
-- waiting out the visibility timeout, and undoes the delivery it was counted, so the job is
-- not charged an attempt for the worker's fault. An entry the consumer no longer owns
-- (reclaimed or acknowledged meanwhile) is left alone.
--
-- KEYS[1] jobs stream   ARGV[1] group   ARGV[2] consumer   ARGV[3] idle in ms
-- ARGV[4..] entry id, delivery count to set, ...
-- Returns how many entries were handed back.
local n = 0
for i = 4, #ARGV, 2 do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if #p == 1 and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i],
      'IDLE', ARGV[3], 'RETRYCOUNT', ARGV[i + 1], 'JUSTID')
    n = n + 1
  end
end
return n
