-- queue_leave.lua: a waiter gives up (timeout, cancel); wake the next one if due.
--
-- KEYS[1]  holders  the lock's hash or the semaphore's zset of live leases.
-- KEYS[2]  queue    zset: waiting tokens scored by ticket.
-- KEYS[3]  alive    zset: waiting tokens scored by heartbeat deadline (server ms).
-- KEYS[4]  asks     hash: each waiting token's request, "<ttl ms> <owner>".
-- KEYS[5]  leases   with rule "semaphore": hash of each lease's fence ("f:<token>").
-- ARGV[1]  token    the waiter's token.
-- ARGV[2]  rule     "lock": KEYS[1] is a lock's hash (see lock_acquire.lua); wake the
--                   new head only when the lock is free.
--                   "semaphore": KEYS[1] is a zset scored by expiry (server ms); if
--                   the token was among the first `ARGV[3] - live leases` waiters
--                   (those allowed a permit; only the head if ARGV[4] is "1"), wake
--                   the one that takes its place (see lib_semaphore.lua).
-- ARGV[3]  limit    with rule "semaphore": the semaphore's limit (integer >= 1).
-- ARGV[4]  fair     with rule "semaphore": "1" when only the head may take a permit.
-- The wake-up channel is derived from KEYS[1] (see wake_channel in lib_lock.lua); a
-- token ending in ".<tag>" is told on `channel:<tag>` (its process's own channel),
-- by SPUBLISH when the tag starts with "s" (see waiter_channel).
--
-- Returns {stamp, reply}: stamp is 'q' and the first 8 characters of ARGV[1]
-- (see LuaScript in scripts.py: a reply is never taken for another call's).
-- reply is {queued, fence}: queued is 1 when the token was queued, else 0; fence is
-- the fence of a live lease the token holds (a release granted it one while it was
-- giving up: the caller keeps or releases it), else 0. A re-sent leave answers the same
-- fence (queued is then 0).

--!include lib_lock.lua

local holders, queue, alive, asks = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, rule = ARGV[1], ARGV[2]
local STAMP = 'q' .. string.sub(ARGV[1], 1, 8)
local now = server_clock()

local rank = redis.call('ZRANK', queue, token)
local removed = redis.call('ZREM', queue, token)
redis.call('ZREM', alive, token)
redis.call('HDEL', asks, token)

local next, fence = nil, 0
if rule == 'semaphore' then
  local expiry = redis.call('ZSCORE', holders, token)
  if expiry and tonumber(expiry) > now then
    fence = tonumber(redis.call('HGET', KEYS[5], 'f:' .. token))
  end
  local live = redis.call('ZCOUNT', holders, string.format('(%d', now), '+inf')
  local free = tonumber(ARGV[3]) - live
  if ARGV[4] == '1' and free > 1 then free = 1 end
  if rank and rank < free then next = redis.call('ZRANGE', queue, free - 1, free - 1)[1] end
else
  fence = live_fence(holders, token, now) or 0
  if rank == 0 and redis.call('EXISTS', holders) == 0 then
    next = redis.call('ZRANGE', queue, 0, 0)[1]
  end
end
if next then notify(wake_channel(holders), next) end
return {STAMP, {removed, fence}}
