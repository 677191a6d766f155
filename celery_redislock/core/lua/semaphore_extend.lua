-- semaphore_extend.lua: reset one live permit's TTL; never revives an expired one.
--
-- KEYS[1]  holders  zset: live leases' tokens scored by expiry (server ms).
-- KEYS[2]  leases   hash: fence, owner and grant time of each lease in holders.
-- KEYS[3]  queue    zset: waiting tokens scored by ticket (FIFO order).
-- KEYS[4]  alive    zset: waiting tokens scored by heartbeat deadline (server ms).
-- KEYS[5]  meta     hash: "limit", the limit the latest acquire enforced.
-- KEYS[6]  asks     hash: each waiting token's request (see semaphore_acquire.lua).
-- ARGV[1]  token    the lease's token.
-- ARGV[2]  ttl      new lease time from now, milliseconds (integer > 0).
-- ARGV[3]  limit    the caller's limit, used when meta holds none (integer >= 1).
-- ARGV[4]  fair     "1": only the queue's head may take a permit (strict FIFO).
-- ARGV[5]  gen      optional: the lease's generation (an explicit TTL change of a
--                   renewed lease), stored as "g:<token>" in leases: renewals
--                   composed before it then change nothing (semaphore_renew.lua).
-- The waiters that may take a permit freed by other, expired leases reaped here are
-- told on the wake-up channel derived from KEYS[1] (see wake_channel in lib_lock.lua).
-- Constants (see lib_lock.lua): WAITER_HEARTBEAT_MS.
--
-- Returns {stamp, reply}: stamp is 'E' and the first 8 characters of ARGV[1]
-- (see LuaScript in scripts.py: a reply is never taken for another call's).
-- reply is 1 when the lease was live and now expires ttl ms from now, 0 when it was
-- not ours (unknown, expired or released).

--!include lib_lock.lua
--!include lib_semaphore.lua

local holders, leases, queue, alive, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local asks = KEYS[6]
local token, ttl, fair = ARGV[1], tonumber(ARGV[2]), ARGV[4] == '1'
local STAMP = 'E' .. string.sub(ARGV[1], 1, 8)
local now = server_clock()

local expiry = redis.call('ZSCORE', holders, token)
local live = expiry and tonumber(expiry) > now
if live then
  redis.call('ZADD', holders, 'XX', string.format('%d', now + ttl), token)
  if ARGV[5] then redis.call('HSET', leases, 'g:' .. token, ARGV[5]) end
  keep_keys(holders, leases, ttl, now)
end

if redis.call('EXISTS', queue) == 1 then
  local limit = stored_limit(meta, tonumber(ARGV[3]))
  local live = redis.call('ZCARD', holders)
  local before = eligible(queue, limit - live, fair)
  live = live - reap_holders(holders, leases, now)
  reap_dead_waiters(queue, alive, asks, now)
  wake_new(wake_channel(holders), before, eligible(queue, limit - live, fair), token)
else
  reap_holders(holders, leases, now)
end
if live then return {STAMP, 1} end
return {STAMP, 0}
