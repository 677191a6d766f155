-- lock_release.lua: give up one lease of a lock, owner-checked by token; hand the
-- freed lock straight to the first waiter.
--
-- KEYS[1]  holders  hash of the lock's live leases (see lock_acquire.lua).
-- KEYS[2]  queue    zset: waiting tokens scored by ticket.
-- KEYS[3]  alive    zset: waiting tokens scored by heartbeat deadline (server ms).
-- KEYS[4]  asks     hash: each waiting token's request, "<ttl ms> <owner>".
-- KEYS[5]  fence    string: last fence granted (see lock_acquire.lua).
-- KEYS[6]  done     string "<prefix>:lock:{name}:done:<token>": written when the lease
--                   is released, kept RELEASE_MEMORY_MS, so a re-sent release (its
--                   reply lost) answers 1 as the first execution did.
-- ARGV[1]  token    the lease's token.
-- ARGV[2]  record   optional, default "1": write KEYS[6] on every release; "0": only
--                   when waiters are queued -- for a caller that sees its own re-sends
--                   and judges a lease found gone by its local deadline (RedisLock on
--                   a plain client, see lock_scripts.py): the common release then
--                   writes nothing but the DEL; "f": never -- an operator's release
--                   of someone else's lease (release_all), whose holder's own
--                   release must then answer 0 (#30).
-- The wake-up channel is derived from KEYS[1] (see wake_channel in lib_lock.lua):
-- messages to a waiter whose token ends in ".<tag>" go to `channel:<tag>` (its
-- process's own channel), by SPUBLISH when the tag starts with "s" (waiter_channel).
-- Constants (see lib_lock.lua): FENCE_MEMORY_MS, WAITER_HEARTBEAT_MS,
-- RELEASE_MEMORY_MS.
--
-- When the lock becomes free and the first live waiter checked in lately and listens
-- (see listening), the lock is granted to it here (its asked TTL and owner)
-- and it is told "<token> <fence>": the hand-off costs the waiter no round trip.
-- Otherwise the waiter is told its token and asks again itself (also when the lease
-- had expired and left the lock free, so it need not poll).
--
-- Returns {stamp, reply}: stamp is 'r' and the first 8 characters of ARGV[1]
-- (see LuaScript in scripts.py: a reply is never taken for another call's).
-- reply is 1 when the lease was live and is now released (also to a re-send of that
-- release when its record was written: see KEYS[6] and ARGV[2]), 0 when it was not
-- ours (unknown, expired, released by someone else -- or by this very request, its
-- record not written, for the caller to judge): a re-sent release changes nothing
-- (it may only repeat the wake-up message).

local holders, queue, token, done = KEYS[1], KEYS[2], ARGV[1], KEYS[6]
local STAMP = 'r' .. string.sub(ARGV[1], 1, 8)

-- Five fields (owner, since, fence and this lease's t: and f:): the only lease. The
-- key expires with it (every script sets both from one clock reading), so the key
-- being there means the lease is live: no clock reading needed, the key goes whole.
-- More fields: other leases of the same owner (re-entry) may keep the lock held.
-- With nobody queued that is all: this common case runs before any helper is
-- defined, so it never makes their closures.
local expiry = redis.call('HGET', holders, 't:' .. token)
local only = expiry and redis.call('HLEN', holders) <= 5
if only then
  redis.call('DEL', holders)
  local queued = redis.call('EXISTS', queue) == 1
  if ARGV[2] ~= 'f' and (queued or ARGV[2] ~= '0') then
    redis.call('SET', done, '1', 'PX', {{RELEASE_MEMORY_MS}})
  end
  if not queued then return {STAMP, 1} end
end

--!include lib_lock.lua

local alive, asks, fence_key = KEYS[3], KEYS[4], KEYS[5]
local channel = wake_channel(holders)

if not expiry then
  -- Released by this very request, whose reply was lost: the same answer again.
  if redis.call('EXISTS', done) == 1 then return {STAMP, 1} end
  -- Not ours (any more). If our lease expired and left the lock free, the head of
  -- the queue may be asleep for a whole poll: wake it. Nothing else changes.
  if redis.call('EXISTS', holders) == 0 then
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if head then notify(channel, head) end
  end
  return {STAMP, 0}
end

local now, now_us = server_clock()
local live = 0
if not only then
  redis.call('HDEL', holders, 't:' .. token, 'f:' .. token, 'g:' .. token)
  live = sweep_leases(holders, now, true)  -- deletes the key when no lease is left
end
if live == 0 and (only or redis.call('EXISTS', queue) == 1) then
  local stale = reap_dead_waiters(queue, alive, asks, now)
  local head = redis.call('ZRANGE', queue, 0, 0)[1]
  local ttl, owner
  if head then ttl, owner = fresh_ask(asks, head, stale) end
  if ttl and listening(channel, head) then
    local fence = next_fence(fence_key, now_us)
    dequeue_waiter(queue, alive, asks, head)
    grant_lock(holders, head, owner, ttl, now, fence)
    tell(channel, head, head .. ' ' .. fence)
  elseif head then
    notify(channel, head)
  end
end
if only then return {STAMP, 1} end
if tonumber(expiry) > now then
  if ARGV[2] ~= 'f' then redis.call('SET', done, '1', 'PX', {{RELEASE_MEMORY_MS}}) end
  return {STAMP, 1}
end
return {STAMP, 0}
