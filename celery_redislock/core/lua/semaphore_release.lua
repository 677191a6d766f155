-- semaphore_release.lua: give back one permit of a semaphore, checked by token.
--
-- KEYS[1]  holders  zset: live leases' tokens scored by expiry (server ms).
-- KEYS[2]  leases   hash: fence, owner and grant time of each lease in holders.
-- KEYS[3]  queue    zset: waiting tokens scored by ticket (FIFO order).
-- KEYS[4]  alive    zset: waiting tokens scored by heartbeat deadline (server ms).
-- KEYS[5]  meta     hash: "limit", the limit the latest acquire enforced.
-- ARGV[1]  token    the lease's token.
-- ARGV[2]  channel  wake-up channel: the waiters that may now take a permit (see
--                   lib_semaphore.lua) are told, and only those.
-- ARGV[3]  limit    the caller's limit, used when meta holds none (integer >= 1).
-- ARGV[4]  fair     "1": only the queue's head may take a permit (strict FIFO).
--
-- Returns 1 when the lease was live and is now released, 0 when it was not ours
-- (unknown, expired, already released): a re-sent release changes nothing.

--!include lib_lock.lua
--!include lib_semaphore.lua

local holders, leases, queue, alive, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local token, channel, fair = ARGV[1], ARGV[2], ARGV[4] == '1'

local expiry = redis.call('ZSCORE', holders, token)
if not expiry then return 0 end
local now = server_clock()
redis.call('ZREM', holders, token)
redis.call('HDEL', leases, 'f:' .. token, 'o:' .. token, 's:' .. token)
if redis.call('EXISTS', queue) == 1 then
  local limit = stored_limit(meta, tonumber(ARGV[3]))
  local live = redis.call('ZCARD', holders)
  local before = eligible(queue, limit - live - 1, fair)
  live = live - reap_holders(holders, leases, now)
  reap_dead_waiters(queue, alive, now)
  wake_new(channel, before, eligible(queue, limit - live, fair), '')
else
  reap_holders(holders, leases, now)
end
if tonumber(expiry) > now then return 1 end
return 0
