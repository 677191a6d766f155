-- park.lua: park a run refused capacity at the tail of its pool's FIFO queue; if
-- capacity is free meanwhile (a lapsed lease, a raised limit), claim the queue's head
-- entries for it at once (see lib_parking.lua for the entry states, lib_capacity.lua
-- for the capacity).
--
-- KEYS[1]  parked    zset: parked entry ids scored by ticket (server µs).
-- KEYS[2]  payloads  hash: "p:<id>" payload, "o:<id>" owner, "t:<id>" ticket;
--                    "reserve", the latest park's ARGV[4] (what releases and sweeps
--                    reserve).
-- KEYS[3]  claimed   zset: claimed entry ids scored by reservation expiry (ms).
-- KEYS[4]  taken     zset: consumed ids (see park_take.lua), read only.
-- KEYS[5]  dead      list: dead-lettered entries (see park_return.lua), unused here.
-- KEYS[6]  done      string "<capacity keys' prefix>:done:<id>": the ids this park
--                    claimed, kept RELEASE_MEMORY_MS, so a re-sent park (its reply
--                    lost) answers as the first did.
-- KEYS[7]… the capacity's keys (see capacity_of in lib_capacity.lua).
-- ARGV[1]  id        the new entry's id (its park token: random, or derived from
--                    the message so that a redelivered copy re-sends a known id).
-- ARGV[2]  payload   opaque bytes: what to publish when the entry is claimed.
-- ARGV[3]  owner     owner id of the reserved capacity (e.g. the task id).
-- ARGV[4]  reserve   milliseconds a claimed entry's capacity is reserved for it.
-- ARGV[5]  keep      milliseconds the parking keys outlive the latest park.
-- ARGV[6]  standby   runs to keep waiting in place ahead of the next release (see
--                    claim_standbys in lib_parking.lua); 0: none.
-- ARGV[7]  intake    "1": park only when the run would be refused -- runs are
--                    parked already, or no capacity is free for it -- else change
--                    nothing and answer {-1} (the caller lets the run start and take
--                    capacity as usual); "0": park.
-- ARGV[8]  sent      when the run was sent, µs since the epoch (the sender's clock);
--                    its ticket then orders it by sending, not by parking, clamped
--                    to [now - SENT_WINDOW_US, now]. Empty: now.
-- ARGV[9]… the capacity's arguments (see capacity_of in lib_capacity.lua); a
--                    semaphore's limit is obeyed and stored for the releases and the
--                    sweepers, as an acquire stores it.
-- Constants (see lib_lock.lua, lib_parking.lua, lib_capacity.lua): FENCE_MEMORY_MS,
-- RELEASE_MEMORY_MS, SENT_WINDOW_US, START_MARGIN_US.
--
-- Returns {stamp, reply} (stamp: 'pk' and the first 8 characters of ARGV[1]); reply
-- is {position, id, payload, ...}: the entry's 1-based place in the queue (0
-- when it was claimed at once), then {id, payload, owner} of each entry claimed, to
-- be published by the caller. When `id` is known already (parked, claimed or taken:
-- a re-sent park, which must never queue a run that started) nothing changes and the
-- reply is its place now (0 once claimed or taken), with the entries the first park
-- claimed that are still claimed.

--!include lib_lock.lua
--!include lib_semaphore.lua
--!include lib_restart.lua
--!include lib_ratelimit.lua
--!include lib_capacity.lua
--!include lib_parking.lua

local STAMP = 'pk' .. string.sub(ARGV[1], 1, 8)
local k = parking_keys(KEYS)
local id, payload, owner = ARGV[1], ARGV[2], ARGV[3]
local reserve, keep = tonumber(ARGV[4]), tonumber(ARGV[5])

if redis.call('HEXISTS', k.payloads, 'p:' .. id) == 1 or redis.call('ZSCORE', k.taken, id) then
  local place = redis.call('ZRANK', k.parked, id)
  local reply, done = {place and place + 1 or 0}, redis.call('GET', KEYS[6]) or ''
  return {STAMP, append_still_claimed(reply, done, k.payloads, k.claimed)}
end

--!include lib_lock.lua
--!include lib_semaphore.lua
--!include lib_restart.lua
--!include lib_ratelimit.lua
--!include lib_capacity.lua
--!include lib_parking.lua
local now, now_us = server_clock()
local c = capacity_of(KEYS, 7, ARGV, 9)
capacity_ready(c, now, now_us, true)
unclaim_lapsed(k, c, now)
if ARGV[7] == '1' and redis.call('EXISTS', k.parked) == 0 and capacity_free(c, now) > 0 then
  return {STAMP, {-1}}
end
local ticket = tonumber(ARGV[8])
if ticket then
  ticket = math.max(math.min(ticket, now_us), now_us - {{SENT_WINDOW_US}})
else
  local tail = redis.call('ZRANGE', k.parked, -1, -1, 'WITHSCORES')
  ticket = now_us
  if tail[2] and tonumber(tail[2]) >= ticket then ticket = tonumber(tail[2]) + 1 end
end
ticket = string.format('%d', ticket)
redis.call('ZADD', k.parked, ticket, id)
redis.call('HSET', k.payloads, 'p:' .. id, payload, 'o:' .. id, owner, 't:' .. id, ticket,
  'reserve', ARGV[4])
for _, key in ipairs({k.parked, k.payloads}) do redis.call('PEXPIRE', key, keep) end
capacity_store(c)

local claimed = claim_free(k, c, tonumber(ARGV[6]), now, now_us, reserve)
local position = redis.call('ZRANK', k.parked, id)
local reply = {0}
if position then reply[1] = position + 1 end
for _, v in ipairs(claimed) do reply[#reply + 1] = v end
if #reply > 1 then
  local ids = {}
  for i = 2, #reply, 3 do ids[#ids + 1] = reply[i] end
  redis.call('SET', KEYS[6], table.concat(ids, ' '), 'PX', {{RELEASE_MEMORY_MS}})
end
return {STAMP, reply}
