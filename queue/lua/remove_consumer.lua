-- Delete a consumer only when it holds no pending entry and has no live heartbeat, so no
-- entry is ever dropped from the pending list with its owner.
--
-- KEYS[1] jobs stream   KEYS[2] the consumer's heartbeat key
-- ARGV[1] group         ARGV[2] consumer
-- Returns 1 when removed.
if #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2]) > 0 then
  return 0
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return 1
