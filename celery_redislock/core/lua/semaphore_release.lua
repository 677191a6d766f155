-- semaphore_release.lua: give back one permit of a semaphore, checked by token; hand
-- the freed permits straight to the first waiters.
--
-- KEYS[1]  holders  zset: live leases' tokens scored by expiry (server ms).
-- KEYS[2]  leases   hash: fence, owner and grant time of each lease in holders.
-- KEYS[3]  queue    zset: waiting tokens scored by ticket (FIFO order).
-- KEYS[4]  alive    zset: waiting tokens scored by heartbeat deadline (server ms).
-- KEYS[5]  meta     hash: "limit", the limit the latest acquire enforced.
-- KEYS[6]  asks     hash: each waiting token's request, "<ttl ms> <owner>".
-- KEYS[7]  fence    string: last fence granted (see semaphore_acquire.lua).
-- ARGV[1]  token    the lease's token.
-- ARGV[2]  channel  wake-up channel (see lib_semaphore.lua).
-- ARGV[3]  limit    the caller's limit, used when meta holds none (integer >= 1).
-- ARGV[4]  fair     "1": only the queue's head may take a permit (strict FIFO).
-- Constants (see lib_lock.lua): FENCE_MEMORY_MS, WAITER_HEARTBEAT_MS.
--
-- Each permit now free goes, in queue order, to a waiter that checked in lately and
-- whose process hears the offer "<token> <fence>": it is granted here, so the
-- hand-off costs it no round trip (see hand_over_permits). Waiters that may take a
-- permit but were not granted one are told their token, and only those.
--
-- Returns 1 when the lease was live and is now released, 0 when it was not ours
-- (unknown, expired, already released): a re-sent release changes nothing.

--!include lib_lock.lua
--!include lib_semaphore.lua

local k = {holders = KEYS[1], leases = KEYS[2], queue = KEYS[3], alive = KEYS[4],
  asks = KEYS[6], fence = KEYS[7]}
local meta, token, channel, fair = KEYS[5], ARGV[1], ARGV[2], ARGV[4] == '1'

local expiry = redis.call('ZSCORE', k.holders, token)
if not expiry then return 0 end
local now, now_us = server_clock()
redis.call('ZREM', k.holders, token)
redis.call('HDEL', k.leases, 'f:' .. token, 'o:' .. token, 's:' .. token)
if redis.call('EXISTS', k.queue) == 1 then
  local limit = stored_limit(meta, tonumber(ARGV[3]))
  local live = redis.call('ZCARD', k.holders)
  local before = eligible(k.queue, limit - live - 1, fair)
  live = live - reap_holders(k.holders, k.leases, now)
  reap_dead_waiters(k.queue, k.alive, k.asks, now)
  local free = hand_over_permits(k, limit - live, now, now_us, channel)
  wake_new(channel, before, eligible(k.queue, free, fair), '')
else
  reap_holders(k.holders, k.leases, now)
end
if tonumber(expiry) > now then return 1 end
return 0
