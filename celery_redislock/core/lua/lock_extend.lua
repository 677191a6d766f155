-- lock_extend.lua: reset one live lease's TTL; never re-creates an expired lock.
--
-- KEYS[1]  holders  hash of the lock's live leases (see lock_acquire.lua).
-- ARGV[1]  token    the lease's token.
-- ARGV[2]  ttl      new lease time from now, milliseconds (integer > 0).
--
-- Returns 1 when the lease was live and now expires ttl ms from now, 0 when it was
-- not ours (unknown, expired or released).

--!include lib_lock.lua

local now = server_clock()
return extend_lease(KEYS[1], ARGV[1], tonumber(ARGV[2]), now)
