-- park_release.lua: give back the capacity a token holds (a semaphore permit,
-- checked by token; none for a pump), then hand the capacity now free on: first to
-- runs waiting for it in place (as semaphore_release.lua does), then to the head of
-- the parked queue, reserving capacity for each entry claimed (see lib_parking.lua,
-- lib_capacity.lua).
--
-- KEYS[1]  parked    zset: parked entry ids scored by ticket (server µs).
-- KEYS[2]  payloads  hash: "p:<id>" payload, "o:<id>" owner, "t:<id>" ticket;
--                    "reserve", the latest park's reservation time (ms).
-- KEYS[3]  claimed   zset: claimed entry ids scored by reservation expiry (ms).
-- KEYS[4]  taken     zset: consumed ids, unused here.
-- KEYS[5]  dead      list: dead-lettered entries, unused here.
-- KEYS[6]  done      string "<capacity keys' prefix>:done:<token>": written when the
--                    capacity is given back, kept RELEASE_MEMORY_MS, holding the ids
--                    this release claimed, so a re-sent release (its reply lost)
--                    answers as the first did (ignored when ARGV[1] is "").
-- KEYS[7]… the capacity's keys (see capacity_of in lib_capacity.lua).
-- ARGV[1]  token     the lease's token; "" gives back nothing (a pump).
-- ARGV[2]  reserve   milliseconds a claimed entry's capacity is reserved for it,
--                    when payloads holds no "reserve" (the latest park's: the
--                    parked task's).
-- ARGV[3]  standby   runs to keep waiting in place ahead of the next release
--                    (claimed without a reservation: see claim_standbys); 0: none.
-- ARGV[4]… the capacity's arguments (see capacity_of in lib_capacity.lua); a
--                    semaphore's limit is used when the semaphore stores none.
-- The wake-up channel is derived from the semaphore's holders key (see
-- wake_channel in lib_lock.lua).
-- Constants (see lib_lock.lua, lib_capacity.lua): FENCE_MEMORY_MS, WAITER_HEARTBEAT_MS,
-- RELEASE_MEMORY_MS, START_MARGIN_US.
--
-- Returns {stamp, reply} (stamp: 'pr' and the first 8 characters of ARGV[1]);
-- reply {released, parked, next, id, payload, ...}: released is 1 when the lease was
-- live and is now released, else 0; parked the entries still queued; next the µs
-- until the queue's head could be claimed (capacity_next: a rate limiter's next
-- admission, with runs still parked; -1: unknown, or none parked); then {id,
-- payload, owner} of each entry claimed (with reserved capacity, then standbys), in
-- queue order, to be published by the caller. A re-sent release changes nothing
-- more and answers 1 with the entries the first claimed that are still claimed. A
-- limit lowered meanwhile is obeyed: only capacity free under the stored limit is
-- handed on.

--!include lib_lock.lua
--!include lib_semaphore.lua
--!include lib_restart.lua
--!include lib_ratelimit.lua
--!include lib_capacity.lua
--!include lib_parking.lua

local STAMP = 'pr' .. string.sub(ARGV[1], 1, 8)
local k = parking_keys(KEYS)
local c = capacity_of(KEYS, 7, ARGV, 4)
local token = ARGV[1]
local now, now_us = server_clock()
local released, removed = capacity_release(c, token, now)
if not released then
  local done = redis.call('GET', KEYS[6])
  if done then  -- released by this very request, whose reply was lost
    local reply = {1, redis.call('ZCARD', k.parked), -1}
    return {STAMP, append_still_claimed(reply, done, k.payloads, k.claimed)}
  end
  released, removed = 0, 0
end
-- Remember a release and the ids it claimed (see KEYS[6]).
local function remember(claimed)
  if released == 0 then return end
  local ids = {}
  for i = 1, #claimed, 3 do ids[#ids + 1] = claimed[i] end
  redis.call('SET', KEYS[6], table.concat(ids, ' '), 'PX', {{RELEASE_MEMORY_MS}})
end
-- Nobody waiting in place, parked or claimed: the common uncontended case.
if capacity_waiting(c) == 0 and redis.call('EXISTS', k.parked, k.claimed) == 0 then
  capacity_free(c, now)  -- reaps expired leases, as every release does
  remember({})
  return {STAMP, {released, 0, -1}}
end

capacity_ready(c, now, now_us, false)
unclaim_lapsed(k, c, now)
capacity_hand_on(c, removed, now, now_us)
local reserve = tonumber(redis.call('HGET', k.payloads, 'reserve')) or tonumber(ARGV[2])
local claimed = claim_free(k, c, tonumber(ARGV[3]), now, now_us, reserve)
local parked = redis.call('ZCARD', k.parked)
local reply = {released, parked, parked > 0 and capacity_next(c, now_us) or -1}
for _, v in ipairs(claimed) do reply[#reply + 1] = v end
remember(claimed)
return {STAMP, reply}
