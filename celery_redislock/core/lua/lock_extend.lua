-- lock_extend.lua: reset one live lease's TTL; never re-creates an expired lock.
--
-- KEYS[1]  holders  hash of the lock's live leases (see lock_acquire.lua).
-- ARGV[1]  token    the lease's token.
-- ARGV[2]  ttl      new lease time from now, milliseconds (integer > 0).
--
-- Returns {stamp, reply}: stamp is 'e' and the first 8 characters of ARGV[1]
-- (see LuaScript in scripts.py: a reply is never taken for another call's).
-- ARGV[3]  gen      optional: the lease's generation (an explicit TTL change of a
--                   renewed lease), stored as "g:<token>": renewals composed before
--                   it, still in flight, then change nothing (lock_renew.lua).
-- reply is 1 when the lease was live and now expires ttl ms from now, 0 when it was
-- not ours (unknown, expired or released).

--!include lib_lock.lua

local STAMP = 'e' .. string.sub(ARGV[1], 1, 8)
local now = server_clock()
local extended = extend_lease(KEYS[1], ARGV[1], tonumber(ARGV[2]), now)
if extended == 1 and ARGV[3] then redis.call('HSET', KEYS[1], 'g:' .. ARGV[1], ARGV[3]) end
return {STAMP, extended}
