-- park_release.lua: give back one permit of a pool that parks runs, checked by
-- token, then hand the permits now free on: first to runs waiting in place (as
-- semaphore_release.lua does), then to the head of the parked queue, reserving a
-- permit for each entry claimed (see lib_parking.lua).
--
-- KEYS[1]  holders   zset: live leases' tokens scored by expiry (server ms).
-- KEYS[2]  leases    hash: fence, owner and grant time of each lease in holders.
-- KEYS[3]  queue     zset: waiting tokens scored by ticket (FIFO order).
-- KEYS[4]  alive     zset: waiting tokens scored by heartbeat deadline (server ms).
-- KEYS[5]  meta      hash: "limit", the limit the latest acquire enforced.
-- KEYS[6]  asks      hash: each waiting token's request, "<ttl ms> <owner>".
-- KEYS[7]  fence     string: last fence granted.
-- KEYS[8]  parked    zset: parked entry ids scored by ticket (server µs).
-- KEYS[9]  payloads  hash: "p:<id>" payload, "o:<id>" owner, "t:<id>" ticket.
-- KEYS[10] claimed   zset: claimed entry ids scored by reservation expiry (ms).
-- KEYS[11] done      string "<prefix>:semaphore:{name}:done:<token>": written when the
--                    lease is released, kept RELEASE_MEMORY_MS, holding the ids this
--                    release claimed, so a re-sent release (its reply lost) answers
--                    as the first did (ignored when ARGV[1] is "").
-- ARGV[1]  token     the lease's token; "" releases nothing (a pump).
-- ARGV[2]  limit     the caller's limit, used when meta holds none (integer >= 1).
-- ARGV[3]  fair      "1": only the queue's head may take a permit (strict FIFO).
-- ARGV[4]  reserve   milliseconds a claimed entry's permit is reserved for it, when
--                    meta holds no "reserve" (the latest park's: the parked task's).
-- ARGV[5]  standby   optional, default 0: runs to keep waiting in place ahead of the
--                    next release (claimed without a permit: see claim_standbys).
-- ARGV[6]  grace     optional: the restart grace, ms (see restart_grace in
--                    lib_restart.lua): within it, permits not taken back yet by their
--                    holders from before a data loss are held for them.
-- The wake-up channel is derived from KEYS[1] (see wake_channel in lib_lock.lua).
-- Constants (see lib_lock.lua): FENCE_MEMORY_MS, WAITER_HEARTBEAT_MS,
-- RELEASE_MEMORY_MS.
--
-- Returns {stamp, reply} (stamp: 'pr' and the first 8 characters of ARGV[1]);
-- reply {released, parked, id, payload, ...}: released is 1 when the lease was
-- live and is now released, else 0; parked the entries still queued; then {id,
-- payload, owner} of each entry claimed (with a reserved permit, then standbys), in
-- queue order, to be published by the caller. A re-sent release changes nothing
-- more and answers 1 with the entries the first claimed that are still claimed. A limit lowered meanwhile is
-- obeyed: only permits free under the stored limit are handed on.

local holders, leases, queue, token = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
local STAMP = 'pr' .. string.sub(ARGV[1], 1, 8)

--!include lib_lock.lua
--!include lib_semaphore.lua
--!include lib_parking.lua

local now, now_us = server_clock()
local released, removed = 0, 0
-- Remember a release and the ids it claimed (see KEYS[11]).
local function remember(claimed)
  if released == 0 then return end
  local ids = {}
  for i = 1, #claimed, 3 do ids[#ids + 1] = claimed[i] end
  redis.call('SET', KEYS[11], table.concat(ids, ' '), 'PX', {{RELEASE_MEMORY_MS}})
end
if token ~= '' then
  local expiry = redis.call('ZSCORE', holders, token)
  if expiry then
    removed = 1
    if tonumber(expiry) > now then released = 1 end
    redis.call('ZREM', holders, token)
    redis.call('HDEL', leases, 'f:' .. token, 'o:' .. token, 's:' .. token, 'g:' .. token)
  else
    local done = redis.call('GET', KEYS[11])
    if done then  -- released by this very request, whose reply was lost
      local reply = {1, redis.call('ZCARD', KEYS[8])}
      return {STAMP, append_still_claimed(reply, done, KEYS[9], KEYS[10])}
    end
  end
end
-- Nobody waiting in place, parked or claimed: the common uncontended case, which
-- needs no other helper (see scripts.py).
local head = redis.call('ZRANGE', queue, 0, 0)[1]
if not head and redis.call('EXISTS', KEYS[8], KEYS[10]) == 0 then
  reap_holders(holders, leases, now)
  remember({})
  return {STAMP, {released, 0}}
end

--!include lib_lock.lua
--!include lib_semaphore.lua
--!include lib_parking.lua

local k = parking_keys(holders, leases, KEYS[7], KEYS[5], KEYS[8], KEYS[9], KEYS[10])
k.queue, k.alive, k.asks = queue, KEYS[4], KEYS[6]
local fair = ARGV[3] == '1'
local limit = stored_limit(KEYS[5], tonumber(ARGV[2]))
local grace = tonumber(ARGV[6])
if grace then
--!include lib_restart.lua
  local left, marker = restart_grace(holders, grace, now_us)
  if left > 0 then hold_for_restart(holders, leases, limit, left, now, marker) end
end
--!include lib_lock.lua
--!include lib_semaphore.lua
--!include lib_parking.lua
unclaim_lapsed(k, now)
local live = redis.call('ZCARD', holders)
local before = eligible(queue, limit - live - removed, fair)
live = live - reap_holders(holders, leases, now)
if head then
  local stale, dropped = reap_dead_waiters(queue, k.alive, k.asks, now)
  if dropped > 0 then head = redis.call('ZRANGE', queue, 0, 0)[1] end
  local channel = wake_channel(holders)
  local free = hand_over_permits(k, limit - live, now, now_us, channel, head, stale)
  wake_new(channel, before, eligible(queue, free, fair), '')
end
local reserve = tonumber(redis.call('HGET', KEYS[5], 'reserve')) or tonumber(ARGV[4])
local claimed = claim_heads(k, free_for_parked(k, queue, limit, now), now, now_us, reserve)
local ahead = claim_standbys(k, queue, tonumber(ARGV[5] or '0'), now, reserve)
local reply = {released, redis.call('ZCARD', k.parked)}
for _, v in ipairs(claimed) do reply[#reply + 1] = v end
for _, v in ipairs(ahead) do reply[#reply + 1] = v end
local rest = {}
for i = 3, #reply do rest[#rest + 1] = reply[i] end
remember(rest)
return {STAMP, reply}
