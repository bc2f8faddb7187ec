-- Store a job's result and retire its stream entry, atomically. Also used to dead-letter.
--
-- KEYS[1] result        KEYS[2] done list      KEYS[3] results stream   KEYS[4] batch hash
-- KEYS[5] jobs stream   KEYS[6] reply_to stream  KEYS[7] idem marker    KEYS[8] dead stream
-- KEYS[9] wake stream
-- ARGV[1] result JSON   ARGV[2] TTL in seconds   ARGV[3] results MAXLEN  ARGV[4] status
-- ARGV[5] group         ARGV[6] entry id         ARGV[7] '1' if batched  ARGV[8] '1' if reply_to
-- ARGV[9] dead MAXLEN   ARGV[10] entries to read after ('0': none)   ARGV[11] reading consumer
-- ARGV[12] how long the wake stream outlives the completion, in ms (at most the TTL)
-- ARGV[13..] dead-letter fields, name value ...; none when completing
--
-- Fenced by delivery: only a completion whose entry is still pending in the group (delivered
-- and not yet acknowledged, by whichever consumer holds it now) may store. A late completion
-- of an entry another delivery already finished (a worker stalled past the visibility
-- timeout, the entry was reclaimed, rerun and acknowledged) changes nothing, even once the
-- first result has expired. A result that already exists wins too: the call then only
-- acknowledges. Returns 1 when this call stored the result, 0 when it did not, 2 when it did
-- not and no result exists for the id either (the entry is gone: Redis lost it, or the result
-- its first completion stored has expired).
-- The wake stream gets one entry (field status) with the result, for waiters blocked on it with
-- XREAD (a read-only command: a waiter needs no write right); it lives ARGV[12] ms.
-- With ARGV[10] > 0, the call then reads up to that many new entries of KEYS[5] for consumer
-- ARGV[11] (XREADGROUP without BLOCK) and returns {stored, entries}, or {stored, false, error}
-- when the read failed; a refused completion reads nothing. A Redis Cluster client sees one
-- reply per script call, so the entries a completion read are never hidden behind another
-- command's error (as they would be in a cluster pipeline).
-- Refused before anything changes: a script does not roll back, so a key of the wrong type
-- found half-way would leave the entry acknowledged and its result half stored. Only the keys
-- whose type the layout fixes are checked; the ones a job names are written with pcall below.
local function wrong_type(key, kind)
  local t = redis.call('TYPE', key).ok
  if t ~= 'none' and t ~= kind then
    return redis.error_reply('WRONGTYPE ' .. key .. ' holds a ' .. t .. ', not a ' .. kind), t
  end
  return nil, t
end
local function finish()
  -- The result key's type also says whether a result exists: nothing below writes it first.
  local refused, result_type = wrong_type(KEYS[1], 'string')
  refused = refused or wrong_type(KEYS[2], 'list') or wrong_type(KEYS[3], 'stream')
    or wrong_type(KEYS[9], 'stream') or (#ARGV > 12 and wrong_type(KEYS[8], 'stream'))
  if refused then
    return refused
  end
  if redis.call('XACK', KEYS[5], ARGV[5], ARGV[6]) == 0 then
    if result_type == 'none' then
      return 2
    end
    return 0
  end
  local stored = 0
  if result_type == 'none' then
    local ttl = ARGV[2]
    redis.call('SET', KEYS[1], ARGV[1], 'EX', ttl)
    redis.call('RPUSH', KEYS[2], ARGV[4])
    redis.call('EXPIRE', KEYS[2], ttl)
    redis.call('XADD', KEYS[9], '*', 'status', ARGV[4])
    redis.call('PEXPIRE', KEYS[9], ARGV[12])
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'result', ARGV[1])
    -- pcall: these keys are named by the job; a wrong type there must not abort the completion
    -- half-way (scripts do not roll back).
    if ARGV[7] == '1' then
      redis.pcall('HINCRBY', KEYS[4], 'done', 1)
      redis.pcall('HINCRBY', KEYS[4], ARGV[4], 1)
      redis.pcall('EXPIRE', KEYS[4], ttl)
    end
    if ARGV[8] == '1' then
      redis.pcall('XADD', KEYS[6], 'MAXLEN', '~', ARGV[3], '*', 'result', ARGV[1])
    end
    -- The marker outlives the job as long as its result, so that the enqueue script refuses
    -- the id by the marker alone; an entry added by a raw XADD gets one here.
    if redis.call('EXPIRE', KEYS[7], ttl) == 0 then
      redis.call('SET', KEYS[7], ARGV[6], 'EX', ttl)
    end
    stored = 1
  end
  if #ARGV > 12 then
    local fields = {}
    for i = 13, #ARGV do
      fields[#fields + 1] = ARGV[i]
    end
    fields[#fields + 1] = 'result_stored'
    fields[#fields + 1] = tostring(stored)
    redis.call('XADD', KEYS[8], 'MAXLEN', '~', ARGV[9], '*', unpack(fields))
  end
  redis.call('XDEL', KEYS[5], ARGV[6])
  return stored
end

local outcome = finish()
if type(outcome) == 'table' or ARGV[10] == '0' then
  return outcome
end
local read = redis.pcall('XREADGROUP', 'GROUP', ARGV[5], ARGV[11], 'COUNT', ARGV[10],
  'STREAMS', KEYS[5], '>')
if type(read) == 'table' and read.err then
  return {outcome, false, read.err}
end
return {outcome, read}
