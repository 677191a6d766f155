-- lock_acquire.lua: grant a lock lease, re-enter it for the same owner, or refuse.
--
-- KEYS[1]  holders  hash: owner, since (ms), fence, and per live lease
--                   "t:<token>" = expiry (server ms) and "f:<token>" = its fence.
--                   Expires with its longest lease, so it exists iff held.
-- KEYS[2]  fence    string: last fence granted; kept FENCE_MEMORY_MS after each grant.
-- KEYS[3]  queue    zset: waiting tokens scored by ticket (FIFO order).
-- KEYS[4]  alive    zset: waiting tokens scored by heartbeat deadline (server ms).
-- KEYS[5]  asks     hash: each waiting token's request, "<ttl ms> <owner>", so a
--                   release can grant the lock to it directly (lock_release.lua).
-- KEYS[6]  boot     optional (Redlock only): this server's boot marker, a string
--                   key named after its run id and the grace (core/redlock/): while
--                   it is missing and the server started less than ARGV[6] ms ago,
--                   nothing is granted (it may have lost leases in a restart).
-- ARGV[1]  token    the new lease's random token.
-- ARGV[2]  ttl      lease time, milliseconds (integer > 0).
-- ARGV[3]  owner    optional, default "" (none): owner id allowing counted re-entry.
-- ARGV[4]  wait     optional, default "0": "1": if refused, join (or stay in) the
--                   wait queue; "0": do not.
-- ARGV[5]  floor    optional (Redlock): least fence to grant, an integer on the
--                   microsecond scale; a new fence is max(last + 1, now in µs, floor).
-- ARGV[6]  grace    with KEYS[6]: milliseconds after start during which a server
--                   without its boot marker grants nothing (the longest lease TTL).
--                   Without KEYS[6], optional: the restart grace, ms (see
--                   lib_restart.lua): within it a free lock is granted to nobody.
-- ARGV[7]  ticket   optional (Redlock): the waiter's place in the queue (µs), the
--                   same on every master; default: the server's clock.
-- (A caller leaves trailing defaults out: each argument costs client CPU.)
-- The wake-up channel (told the new head when a dead head is dropped; on
-- `channel:<tag>` when its token ends in ".<tag>") is derived from KEYS[1] (see
-- wake_channel in lib_lock.lua).
-- Constants (see lib_lock.lua): FENCE_MEMORY_MS, WAITER_HEARTBEAT_MS; BOOT_MARKER_MS
-- (how long a boot marker is kept; it is set again after it lapses).
--
-- Returns {stamp, reply}: stamp is 'a' and the first 8 characters of ARGV[1]
-- (see LuaScript in scripts.py: a reply is never taken for another call's).
-- reply is the new lease's fence (an integer) when granted a new lease, so the
-- common reply is the cheapest to build and parse; {1, fence, ms_left} when the
-- token holds a live lease already (a client's re-sent request: retries are
-- idempotent; or a lease a release granted to this waiter: ms_left is the TTL it
-- has left); {0, wait_ms, holder} when refused: wait_ms is the holder's TTL left,
-- or 0 when the lock is free but reserved for an earlier waiter; holder is the
-- holding owner id ("" when none or free); {0, wait_ms, "", "restarted"} when the
-- boot marker is missing within the grace, or the lock is free within a restart
-- grace (wait_ms: until the grace ends).

local holders, fence_key, queue = KEYS[1], KEYS[2], KEYS[3]
local token, ttl, owner = ARGV[1], tonumber(ARGV[2]), ARGV[3] or ''
local STAMP = 'a' .. string.sub(ARGV[1], 1, 8)

--!include lib_lock.lua

local now, now_us = server_clock()

-- Redlock: a server that may have lost leases in a restart (no boot marker, started
-- within the grace) grants nothing until every lease it could have held expired.
-- INFO's uptime is the difference of two whole-second wall clock readings (now and
-- the start, each rounded down), so it reads 1 as little as a millisecond after the
-- start: one second less is never older than the server is (measured: 1 from 0.75 s).
-- The marker is read with the lock's keys (see `taken` below): EXISTS counts a key
-- once per time it is named, so naming it three times makes 3..5 mean "there" and
-- 0..2 "missing", whatever the other two are; the count less the marker's is theirs.
local boot = KEYS[6]
local taken
if boot then
  taken = redis.call('EXISTS', boot, boot, boot, holders, queue)
  if taken >= 3 then
    taken = taken - 3
  else
    local info = redis.call('INFO', 'server')
    -- Negative after a wall clock stepped back since the start: taken as 0 (see
    -- server_age_ms in lib_restart.lua).
    local up = math.max(0, tonumber(string.match(info, 'uptime_in_seconds:(-?%d+)')) - 1) * 1000
    local grace = tonumber(ARGV[6])
    if up < grace then return {STAMP, {0, grace - up, '', 'restarted'}} end
    redis.call('SET', boot, string.format('%d', now), 'PX', {{BOOT_MARKER_MS}})
  end
else
  taken = redis.call('EXISTS', holders, queue)
  -- A standalone lock's restart grace (see lib_restart.lua): a free lock is granted
  -- to nobody until the server is `grace` old after a loss of its data (a lease
  -- it forgot may still run; its renewal puts it back).
  local grace = tonumber(ARGV[6])
  if grace and taken == 0 then
--!include lib_restart.lua
    local left = restart_grace(holders, grace, now_us)
    if left > 0 then return {STAMP, {0, left, '', 'restarted'}} end
  end
end
--!include lib_lock.lua
-- The fence base: the server's µs clock, or the caller's floor when higher.
local fence_us = now_us
local floor = tonumber(ARGV[5])
if floor and floor > now_us then fence_us = floor end

-- Uncontended: neither held nor anyone queued (one EXISTS for both keys, above).
-- This runs before the other helpers are defined: a run that returns here never
-- makes their closures.
if taken == 0 then
  local fence, n = next_fence(fence_key, fence_us)
  grant_lock(holders, token, owner, ttl, now, fence)
  return {STAMP, n}
end

--!include lib_lock.lua

local alive, asks = KEYS[4], KEYS[5]
local wait = ARGV[4] == '1'

-- Another lease of the holding owner (re-entry).
local function reenter()
  local fence, n = next_fence(fence_key, fence_us)
  local expiry = string.format('%d', now + ttl)
  redis.call('HSET', holders, 'fence', fence, 't:' .. token, expiry, 'f:' .. token, fence)
  if redis.call('PTTL', holders) < ttl then redis.call('PEXPIREAT', holders, expiry) end
  return n
end

local function refuse(wait_ms, holder)
  if wait then
    enqueue_waiter(queue, alive, asks, token, ttl, owner, now, now_us, tonumber(ARGV[7]))
  end
  return {0, wait_ms, holder}
end

if redis.call('EXISTS', holders) == 1 then
  local fence, left = live_fence(holders, token, now)
  if fence then return {STAMP, {1, fence, left}} end
  local live, longest = sweep_leases(holders, now, false)
  if live > 0 then
    local holder = redis.call('HGET', holders, 'owner')
    if owner ~= '' and holder == owner then
      -- Re-entered while queued (a poll of an earlier wait): out of the queue, or a
      -- later release would grant this token a second lease nobody would use.
      if redis.call('ZSCORE', queue, token) then dequeue_waiter(queue, alive, asks, token) end
      return {STAMP, reenter()}
    end
    -- Held: dead waiters are dropped here too (every live waiter asks at least once
    -- a second), so the heartbeat rule holds while the lock stays held.
    if redis.call('EXISTS', queue) == 1 then reap_dead_waiters(queue, alive, asks, now) end
    return {STAMP, refuse(longest - now, holder)}
  end
end

-- The lock is free. Waiters queued earlier go first (no barging past them).
if redis.call('EXISTS', queue) == 1 then
  local before, head = reap_waiters(queue, alive, asks, now)
  if head and head ~= token then
    if head ~= before then notify(wake_channel(holders), head) end
    return {STAMP, refuse(0, '')}
  end
  if head then dequeue_waiter(queue, alive, asks, token) end
end
local fence, n = next_fence(fence_key, fence_us)
grant_lock(holders, token, owner, ttl, now, fence)
return {STAMP, n}
