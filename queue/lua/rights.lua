-- Whether the caller's ACL user may run what a worker node runs on one queue's keys, checked
-- without running any of it (redis.acl_check_cmd, Redis 7).
--
-- ARGV[1] group   ARGV[2] consumer
-- ARGV[3] jobs stream   ARGV[4] result   ARGV[5] done list   ARGV[6] results stream
-- ARGV[7] dead stream   ARGV[8] idem marker   ARGV[9] batch hash   ARGV[10] worker heartbeat
-- ARGV[11] cancelled set   ARGV[12] wake stream
-- ARGV[13] this node's session calls stream   ARGV[14] a call's event stream
-- ARGV[15] a session's hash   ARGV[16] live sessions (sorted set)
-- The key names come as arguments, not KEYS: nothing here touches them, and Redis checks a
-- script's KEYS against the caller's rights before it runs, which would fail with a NOPERM that
-- names no key. (The queue's meta hash is checked by the layout check, which reads it first.)
--
-- Returns '' when every command is allowed, else 'COMMAND on KEY' of the first that is not.
-- Redis before 7.0 has no redis.acl_check_cmd: nothing is checked there.
if not redis.acl_check_cmd then
  return ''
end
local g, c = ARGV[1], ARGV[2]
local KEYS = {ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11],
  ARGV[12], ARGV[13], ARGV[14], ARGV[15], ARGV[16]}
local checks = {
  {'XREADGROUP', 'GROUP', g, c, 'STREAMS', KEYS[1], '>'},
  {'XACK', KEYS[1], g, '0-1'},
  {'XDEL', KEYS[1], '0-1'},
  {'XCLAIM', KEYS[1], g, c, '0', '0-1'},
  {'XAUTOCLAIM', KEYS[1], g, c, '0', '0-0'},
  {'XPENDING', KEYS[1], g},
  {'XGROUP', 'CREATE', KEYS[1], g, '0', 'MKSTREAM'},
  {'XINFO', 'GROUPS', KEYS[1]},
  {'XADD', KEYS[1], '*', 'job', '{}'},
  {'XRANGE', KEYS[1], '-', '+'},
  {'XLEN', KEYS[1]},
  {'SET', KEYS[2], 'x'},
  {'GET', KEYS[2]},
  {'EXISTS', KEYS[2]},
  {'TYPE', KEYS[2]},
  {'RPUSH', KEYS[3], 'x'},
  {'EXPIRE', KEYS[3], '1'},
  {'XADD', KEYS[4], '*', 'result', '{}'},
  {'XADD', KEYS[5], '*', 'x', 'y'},
  {'XRANGE', KEYS[5], '-', '+'},
  {'SET', KEYS[6], 'x'},
  {'EXPIRE', KEYS[6], '1'},
  {'HINCRBY', KEYS[7], 'done', '1'},
  {'EXPIRE', KEYS[7], '1'},
  {'SET', KEYS[8], 'x'},
  {'ZRANGEBYSCORE', KEYS[9], '0', '+inf'},
  {'XADD', KEYS[10], '*', 'status', 'ok'},
  {'PEXPIRE', KEYS[10], '1'},
  -- Sessions: the calls reader (and its start), a call's events, the record (session_open.lua,
  -- session_end.lua, session_lost.lua).
  {'XREAD', 'STREAMS', KEYS[11], '0-0'},
  {'XREVRANGE', KEYS[11], '+', '-', 'COUNT', '1'},
  {'XADD', KEYS[12], '*', 'event', '{}'},
  {'XREVRANGE', KEYS[12], '+', '-', 'COUNT', '1'},
  {'PEXPIRE', KEYS[12], '1'},
  {'TYPE', KEYS[13]},
  {'DEL', KEYS[13]},
  {'HSET', KEYS[13], 'state', 'live'},
  {'HGET', KEYS[13], 'node'},
  {'EXPIRE', KEYS[13], '1'},
  {'TYPE', KEYS[14]},
  {'ZADD', KEYS[14], '0', 'x'},
  {'ZREM', KEYS[14], 'x'},
}
for _, check in ipairs(checks) do
  if not redis.acl_check_cmd(unpack(check)) then
    local key = check[2]
    if check[1] == 'XREADGROUP' or check[1] == 'XGROUP' or check[1] == 'XINFO'
      or check[1] == 'XREAD' then
      key = check[1] == 'XREADGROUP' and check[6] or check[3]
    end
    return check[1] .. ' on ' .. key
  end
end
return ''
