-- semaphore_extend_add.lua: add time to what one live permit has left; never revives
-- an expired one.
--
-- KEYS[1]  holders  zset: live leases' tokens scored by expiry (server ms).
-- KEYS[2]  leases   hash: fence, owner and grant time of each lease in holders.
-- KEYS[3]  added    hash: token -> "<nonce> <expiry ms>" of the token's last addition.
--                   A request re-sent after its reply was lost (redis-py retries on
--                   ConnectionError/TimeoutError) carries the same nonce and is
--                   answered as the first one was instead of adding twice.
-- ARGV[1]  token    the lease's token.
-- ARGV[2]  ttl      milliseconds to add to the lease's time left (integer > 0).
-- ARGV[3]  nonce    this request's id (fresh for each call, the same when re-sent).
-- ARGV[4]  gen      optional: the lease's generation (an explicit TTL change of a
--                   renewed lease), stored as "g:<token>" in leases: renewals
--                   composed before it, still in flight, then change nothing.
--
-- Returns {stamp, reply}: stamp is 'x' and the first 8 characters of ARGV[1] (see
-- LuaScript in scripts.py). reply is the milliseconds the lease has left afterwards (>
-- 0) when it was live, 0 when it was not ours (unknown, expired or released). Frees no
-- permit, so wakes no waiter.

--!include lib_lock.lua
--!include lib_semaphore.lua

local STAMP = 'x' .. string.sub(ARGV[1], 1, 8)
local holders, leases, added = KEYS[1], KEYS[2], KEYS[3]
local token, nonce = ARGV[1], ARGV[3]
local now = server_clock()
local expiry = redis.call('ZSCORE', holders, token)
if not expiry or tonumber(expiry) <= now then return {STAMP, 0} end
expiry = tonumber(expiry)
local last = redis.call('HGET', added, token)
if last and string.match(last, '^(%S+) ') == nonce then return {STAMP, expiry - now} end
local target = expiry + tonumber(ARGV[2])
redis.call('ZADD', holders, 'XX', string.format('%d', target), token)
keep_keys(holders, leases, target - now, now)
redis.call('HSET', added, token, nonce .. ' ' .. string.format('%d', target))
if ARGV[4] then redis.call('HSET', leases, 'g:' .. token, ARGV[4]) end
if redis.call('PTTL', added) < target - now then
  redis.call('PEXPIREAT', added, string.format('%d', target))
end
return {STAMP, target - now}
