-- semaphore_acquire.lua: grant one permit of a semaphore, or refuse (and queue).
--
-- KEYS[1]  holders  zset: live leases' tokens scored by expiry (server ms).
-- KEYS[2]  leases   hash: "f:<token>" fence, "o:<token>" owner, "s:<token>" granted
--                   at (server ms), for each lease in holders.
-- KEYS[3]  fence    string: last fence granted; kept FENCE_MEMORY_MS after each grant.
-- KEYS[4]  queue    zset: waiting tokens scored by ticket (server µs at enqueue).
-- KEYS[5]  alive    zset: waiting tokens scored by heartbeat deadline (server ms).
-- KEYS[6]  meta     hash: "limit", the limit the latest acquire enforced; kept
--                   FENCE_MEMORY_MS after each grant or change.
-- KEYS[7]  asks     hash: each waiting token's request, "<ttl ms>:<limit> <owner>", so a
--                   release can grant it a permit directly (semaphore_release.lua).
-- ARGV[1]  token    the new lease's random token.
-- ARGV[2]  ttl      lease time, milliseconds (integer > 0).
-- ARGV[3]  limit    the caller's limit (integer >= 1): enforced, and stored in meta.
-- ARGV[4]  fair     "1": only the queue's head may take a permit (strict FIFO).
--                   "0": the first `free` waiters may, and so may anyone else
--                   (a newcomer barges in) unless the head has waited too long.
-- ARGV[5]  patience microseconds the head may wait before barging stops (not fair).
-- ARGV[6]  wait     "1": if refused, join (or stay in) the wait queue; "0": do not.
-- ARGV[7]  owner    optional, default "": owner id recorded for inspection.
-- ARGV[8]  grace    optional: the restart grace, ms (see restart_grace in
--                   lib_restart.lua): within it, permits not taken back yet by their
--                   holders from before a data loss are held for them.
-- The wake-up channel (waiters that may now take a permit are told) is derived from
-- KEYS[1] (see wake_channel in lib_lock.lua).
-- Constants (see lib_lock.lua): FENCE_MEMORY_MS, WAITER_HEARTBEAT_MS.
--
-- Returns {stamp, reply}: stamp is 'A' and the first 8 characters of ARGV[1]
-- (see LuaScript in scripts.py: a reply is never taken for another call's).
-- reply is {1, fence, previous, ms_left} when granted (also when the same token asks
-- again while its lease is live: client retries hold one permit, and a permit a
-- release granted to this waiter is found so; ms_left is the TTL the lease has
-- left), {0, wait_ms, previous} when refused: wait_ms is the time until the earliest
-- lease expires when all permits are held, 0 when a permit is free but due to an
-- earlier waiter. previous is the stored limit when this call changed it, else 0.

local holders, leases, fence_key = KEYS[1], KEYS[2], KEYS[3]
local queue, alive, meta, asks = KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local token, ttl, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local fair, patience, wait = ARGV[4] == '1', tonumber(ARGV[5]), ARGV[6] == '1'
local owner = ARGV[7] or ''
local STAMP = 'A' .. string.sub(ARGV[1], 1, 8)

--!include lib_lock.lua
--!include lib_semaphore.lua

local now, now_us = server_clock()

local expiry = redis.call('ZSCORE', holders, token)
if expiry and tonumber(expiry) > now then
  return {STAMP, {1, tonumber(redis.call('HGET', leases, 'f:' .. token)), 0,
    tonumber(expiry) - now}}
end

local grace = tonumber(ARGV[8])
if grace then
--!include lib_restart.lua
  local left, marker = restart_grace(holders, grace, now_us)
  if left > 0 then hold_for_restart(holders, leases, limit, left, now, marker) end
end
--!include lib_lock.lua
--!include lib_semaphore.lua

-- The caller's limit is the one enforced; store it for the releases and the views.
local stored = tonumber(redis.call('HGET', meta, 'limit'))
local previous = 0
if stored ~= limit then
  redis.call('HSET', meta, 'limit', ARGV[3])
  redis.call('PEXPIRE', meta, {{FENCE_MEMORY_MS}})
  previous = stored or 0
end

local waiting = redis.call('ZCARD', queue)
local queued = waiting > 0
local live = redis.call('ZCARD', holders)
local before = {}
if queued then before = eligible(queue, (stored or limit) - live, fair) end
-- The earliest lease: reaping is due only when it expired, and a refusal answers
-- with its expiry.
local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
if first[2] and tonumber(first[2]) <= now then
  live = live - reap_holders(holders, leases, now)
  first = nil
end
if queued then
  local _, dropped = reap_dead_waiters(queue, alive, asks, now)
  waiting = waiting - dropped
end
local free = limit - live

local allowed, rank = free > 0, false
if allowed and queued then
  rank = redis.call('ZRANK', queue, token)
  if fair then
    allowed = rank == 0 or (not rank and waiting == 0)
  elseif not (rank and rank < free) then
    local head = redis.call('ZRANGE', queue, 0, 0, 'WITHSCORES')
    if head[2] and now_us - tonumber(head[2]) > patience then
      allowed = waiting < free  -- the head starves: no barging
    end
  end
end

if not allowed then
  if queued then
    wake_new(wake_channel(holders), before, eligible(queue, free, fair), token)
  end
  if wait then enqueue_waiter(queue, alive, asks, token, ttl, owner, now, now_us, nil, limit) end
  local wait_ms = 0
  if free <= 0 then
    first = first or redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
    if first[2] then wait_ms = tonumber(first[2]) - now end
  end
  return {STAMP, {0, wait_ms, previous}}
end

-- Granted: the helpers only this case needs are defined here (see scripts.py).
--!include lib_lock.lua
--!include lib_semaphore.lua

local fence = next_fence(fence_key, now_us)
grant_permit(holders, leases, token, owner, ttl, now, fence)
redis.call('PEXPIREAT', meta, string.format('%d', now + {{FENCE_MEMORY_MS}}))
if rank then dequeue_waiter(queue, alive, asks, token) end
if queued then
  wake_new(wake_channel(holders), before, eligible(queue, free - 1, fair), token)
end
return {STAMP, {1, tonumber(fence), previous, ttl}}
