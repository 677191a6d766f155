-- lock_release_owner.lua: release every lease of a lock held by one owner (or any).
-- For operators and hand-over code that know the owner but not the token.
--
-- KEYS[1]  holders  hash of the lock's live leases (see lock_acquire.lua).
-- KEYS[2]  queue    zset: waiting tokens scored by ticket.
-- KEYS[3]  alive    zset: waiting tokens scored by heartbeat deadline (server ms).
-- KEYS[4]  asks     hash: each waiting token's request (see lock_acquire.lua).
-- KEYS[5]  done     string "<prefix>:lock:{name}:done:<nonce>": this call's answer, kept
--                   RELEASE_MEMORY_MS, so a re-send (its reply lost) answers the same.
-- ARGV[1]  nonce    a fresh random string per call (names KEYS[5]).
-- ARGV[2]  owner    release only if the lock's owner id is this; "" for any owner.
-- The first live waiter's token is published on the wake-up channel, derived from
-- KEYS[1] (see wake_channel in lib_lock.lua; on `channel:<tag>` when the token ends
-- in ".<tag>").
-- Constants (see lib_lock.lua): WAITER_HEARTBEAT_MS, RELEASE_MEMORY_MS.
--
-- Returns {stamp, reply}: stamp is 'o' and the first 8 characters of ARGV[1]
-- (see LuaScript in scripts.py: a reply is never taken for another call's).
-- reply is the number of live leases released (0 when free or held by another owner).

--!include lib_lock.lua

local holders, queue, alive, asks = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, done = ARGV[2], KEYS[5]
local STAMP = 'o' .. string.sub(ARGV[1], 1, 8)

local answered = redis.call('GET', done)
if answered then return {STAMP, tonumber(answered)} end  -- a re-send
if redis.call('EXISTS', holders) == 0 then return {STAMP, 0} end
if owner ~= '' and redis.call('HGET', holders, 'owner') ~= owner then return {STAMP, 0} end
local now = server_clock()
local live = sweep_leases(holders, now, true)
redis.call('DEL', holders)
if live > 0 and redis.call('EXISTS', queue) == 1 then
  local _, head = reap_waiters(queue, alive, asks, now)
  if head then notify(wake_channel(holders), head) end
end
redis.call('SET', done, string.format('%d', live), 'PX', {{RELEASE_MEMORY_MS}})
return {STAMP, live}
