-- semaphore_release.lua: give back one permit of a semaphore, checked by token; hand
-- the freed permits straight to the first waiters.
--
-- KEYS[1]  holders  zset: live leases' tokens scored by expiry (server ms).
-- KEYS[2]  leases   hash: fence, owner and grant time of each lease in holders.
-- KEYS[3]  queue    zset: waiting tokens scored by ticket (FIFO order).
-- KEYS[4]  alive    zset: waiting tokens scored by heartbeat deadline (server ms).
-- KEYS[5]  meta     hash: "limit", the limit the latest acquire enforced.
-- KEYS[6]  asks     hash: each waiting token's request, "<ttl ms>:<limit> <owner>" (granted under its own limit).
-- KEYS[7]  fence    string: last fence granted (see semaphore_acquire.lua).
-- KEYS[8]  done     string "<prefix>:semaphore:{name}:done:<token>": written when the
--                   lease is released ("=" and the grants answered, see ARGV[4]),
--                   kept RELEASE_MEMORY_MS, so a re-sent release (its reply lost)
--                   answers as the first execution did.
-- ARGV[1]  token    the lease's token.
-- ARGV[2]  limit    the caller's limit, used when meta holds none (integer >= 1).
-- ARGV[3]  fair     "1": only the queue's head may take a permit (strict FIFO).
-- ARGV[4]  here     optional: the caller's own waiter tag (its event loop's, see
--                   asyncio/notifier.py). Its waiters granted a permit here are not
--                   told by message: the reply names them (see below).
-- ARGV[5]  grace    optional: the restart grace, ms (see restart_grace in
--                   lib_restart.lua); ARGV[4] is then "" when no tag is given.
-- ARGV[6]  forced   optional: "f" for an operator's release of someone else's lease
--                   (release_all): KEYS[8] is not written, so the holder's own
--                   release then answers 0 (#30); ARGV[4], ARGV[5] may be "".
-- The wake-up channel is derived from KEYS[1] (see wake_channel in lib_lock.lua).
-- Constants (see lib_lock.lua): FENCE_MEMORY_MS, WAITER_HEARTBEAT_MS,
-- RELEASE_MEMORY_MS.
--
-- Each permit now free goes, in queue order, to a waiter that checked in lately and
-- whose process hears the offer "<token> <fence>": it is granted here, so the
-- hand-off costs it no round trip (see hand_over_permits). Waiters that may take a
-- permit but were not granted one are told their token, and only those.
--
-- Returns {stamp, reply}: stamp is 'R' and the first 8 characters of ARGV[1]
-- (see LuaScript in scripts.py: a reply is never taken for another call's).
-- reply is 1 when the lease was live and is now released (also to a re-send of that
-- release: see KEYS[8]), 0 when it was not ours (unknown, expired, released by
-- someone else): a re-sent release changes nothing. With ARGV[4], reply is
-- {released, granted}: granted is "<token> <fence>" of each waiter of tag ARGV[4]
-- granted a permit here, space-separated ("" when none).

local holders, leases, queue, token = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
local here = ARGV[4]
if here == '' then here = nil end
local STAMP = 'R' .. string.sub(ARGV[1], 1, 8)

-- The answer, with the grants to the caller's own waiters when it asked for them;
-- a release of a live lease is remembered with them (see KEYS[8]).
local function answer(released, granted)
  if released == 1 and ARGV[6] ~= 'f' then
    redis.call('SET', KEYS[8], '=' .. granted, 'PX', {{RELEASE_MEMORY_MS}})
  end
  if here then return {STAMP, {released, granted}} end
  return {STAMP, released}
end

--!include lib_lock.lua
--!include lib_semaphore.lua

local expiry = redis.call('ZSCORE', holders, token)
if not expiry then
  -- Released by this very request, whose reply was lost: the same answer again.
  local done = redis.call('GET', KEYS[8])
  if not done then return answer(0, '') end
  if here then return {STAMP, {1, string.sub(done, 2)}} end
  return {STAMP, 1}
end
local now, now_us = server_clock()
local released = 0
if tonumber(expiry) > now then released = 1 end
redis.call('ZREM', holders, token)
redis.call('HDEL', leases, 'f:' .. token, 'o:' .. token, 's:' .. token, 'g:' .. token)
-- The queue's head, read at once: nobody queued is the whole of the common
-- uncontended case, which then needs no other helper (see scripts.py).
local head = redis.call('ZRANGE', queue, 0, 0)[1]
if not head then
  reap_holders(holders, leases, now)
  return answer(released, '')
end

--!include lib_lock.lua
--!include lib_semaphore.lua

local k = {holders = holders, leases = leases, queue = queue, alive = KEYS[4],
  asks = KEYS[6], fence = KEYS[7]}
local fair = ARGV[3] == '1'
local limit = stored_limit(KEYS[5], tonumber(ARGV[2]))
local grace = tonumber(ARGV[5])
if grace then
--!include lib_restart.lua
  local left, marker = restart_grace(holders, grace, now_us)
  if left > 0 then hold_for_restart(holders, leases, limit, left, now, marker) end
end
--!include lib_lock.lua
--!include lib_semaphore.lua
local live = redis.call('ZCARD', holders)
local before = eligible(queue, limit - live - 1, fair)
live = live - reap_holders(holders, leases, now)
local stale, dropped = reap_dead_waiters(queue, k.alive, k.asks, now)
if dropped > 0 then head = redis.call('ZRANGE', queue, 0, 0)[1] end
local channel = wake_channel(holders)
local granted = {}
local free = hand_over_permits(k, limit - live, now, now_us, channel, head, stale, here, granted)
wake_new(channel, before, eligible(queue, free, fair), '')
return answer(released, table.concat(granted, ' '))
