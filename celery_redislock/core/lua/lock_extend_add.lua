-- lock_extend_add.lua: add time to what one live lease has left; never re-creates an
-- expired lock.
--
-- KEYS[1]  holders  hash of the lock's live leases (see lock_acquire.lua).
-- KEYS[2]  added    hash: token -> "<nonce> <expiry ms>" of the token's last addition.
--                   A request re-sent after its reply was lost (redis-py retries on
--                   ConnectionError/TimeoutError) carries the same nonce and is
--                   answered as the first one was instead of adding twice.
-- ARGV[1]  token    the lease's token.
-- ARGV[2]  ttl      milliseconds to add to the lease's time left (integer > 0).
-- ARGV[3]  nonce    this request's id (fresh for each call, the same when re-sent).
-- ARGV[4]  gen      optional: the lease's generation (an explicit TTL change of a
--                   renewed lease), stored as "g:<token>" in holders: renewals
--                   composed before it, still in flight, then change nothing
--                   (0: none, as when left out).
-- ARGV[5]  cap      optional: the most milliseconds the lease may have left
--                   afterwards (a Redlock's max_ttl: no master keeps a lease longer
--                   than its restart grace); the addition stops there.
--
-- Returns {stamp, reply}: stamp is 'x' and the first 8 characters of ARGV[1] (see
-- LuaScript in scripts.py). reply is the milliseconds the lease has left afterwards (>
-- 0) when it was live, 0 when it was not ours (unknown, expired or released).

--!include lib_lock.lua

local STAMP = 'x' .. string.sub(ARGV[1], 1, 8)
local holders, added, token, nonce = KEYS[1], KEYS[2], ARGV[1], ARGV[3]
local now = server_clock()
local expiry = redis.call('HGET', holders, 't:' .. token)
if not expiry or tonumber(expiry) <= now then return {STAMP, 0} end
expiry = tonumber(expiry)
local last = redis.call('HGET', added, token)
if last and string.match(last, '^(%S+) ') == nonce then return {STAMP, expiry - now} end
local target = expiry + tonumber(ARGV[2])
if ARGV[5] then target = math.min(target, now + tonumber(ARGV[5])) end
extend_lease(holders, token, target - now, now)
redis.call('HSET', added, token, nonce .. ' ' .. string.format('%d', target))
if ARGV[4] then redis.call('HSET', holders, 'g:' .. token, ARGV[4]) end
if redis.call('PTTL', added) < target - now then
  redis.call('PEXPIREAT', added, string.format('%d', target))
end
return {STAMP, target - now}
