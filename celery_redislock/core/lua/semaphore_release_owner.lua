-- semaphore_release_owner.lua: release every permit of a semaphore held by one owner
-- (or by anyone). For code that knows the owner but not the token: a worker's main
-- process cleaning up after a dead child, an operator clearing a stuck permit.
--
-- KEYS[1]  holders  zset: live leases' tokens scored by expiry (server ms).
-- KEYS[2]  leases   hash: fence, owner and grant time of each lease in holders.
-- KEYS[3]  queue    zset: waiting tokens scored by ticket (FIFO order).
-- KEYS[4]  alive    zset: waiting tokens scored by heartbeat deadline (server ms).
-- KEYS[5]  meta     hash: "limit", the limit the latest acquire enforced.
-- KEYS[6]  asks     hash: each waiting token's request (see semaphore_acquire.lua).
-- KEYS[7]  done     string "<prefix>:semaphore:{name}:done:<nonce>": this call's answer,
--                   kept RELEASE_MEMORY_MS, so a re-send (its reply lost) answers the same.
-- ARGV[1]  nonce    a fresh random string per call (names KEYS[7]).
-- ARGV[2]  owner    release the leases whose owner id is exactly this; "" for all.
-- ARGV[3]  limit    the caller's limit, used when meta holds none (integer >= 1).
-- ARGV[4]  fair     "1": only the queue's head may take a permit (strict FIFO).
-- The waiters that may now take a permit (see lib_semaphore.lua) are told, and only
-- those, on the wake-up channel derived from KEYS[1] (see wake_channel in
-- lib_lock.lua).
-- Constants (see lib_lock.lua): WAITER_HEARTBEAT_MS, RELEASE_MEMORY_MS.
--
-- Returns {stamp, reply}: stamp is 'O' and the first 8 characters of ARGV[1]
-- (see LuaScript in scripts.py: a reply is never taken for another call's).
-- reply is the number of live leases released (0 when none matched).

--!include lib_lock.lua
--!include lib_semaphore.lua

local holders, leases, queue, alive, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local asks = KEYS[6]
local owner, fair, done = ARGV[2], ARGV[4] == '1', KEYS[7]
local STAMP = 'O' .. string.sub(ARGV[1], 1, 8)

local answered = redis.call('GET', done)
if answered then return {STAMP, tonumber(answered)} end  -- a re-send
if redis.call('EXISTS', holders) == 0 then return {STAMP, 0} end
local now = server_clock()
local queued = redis.call('EXISTS', queue) == 1
local limit = stored_limit(meta, tonumber(ARGV[3]))
local before = {}
if queued then before = eligible(queue, limit - redis.call('ZCARD', holders), fair) end

-- A semaphore has at most `limit` live leases (plus expired ones not reaped yet), so
-- looking at each owner is cheap.
local released = 0
local rows = redis.call('ZRANGE', holders, 0, -1, 'WITHSCORES')
for i = 1, #rows, 2 do
  local t = rows[i]
  if owner == '' or redis.call('HGET', leases, 'o:' .. t) == owner then
    redis.call('ZREM', holders, t)
    redis.call('HDEL', leases, 'f:' .. t, 'o:' .. t, 's:' .. t, 'g:' .. t)
    if tonumber(rows[i + 1]) > now then released = released + 1 end
  end
end
local live = redis.call('ZCARD', holders) - reap_holders(holders, leases, now)
if queued then
  reap_dead_waiters(queue, alive, asks, now)
  wake_new(wake_channel(holders), before, eligible(queue, limit - live, fair), '')
end
redis.call('SET', done, string.format('%d', released), 'PX', {{RELEASE_MEMORY_MS}})
return {STAMP, released}
