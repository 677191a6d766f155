-- redlock_floor.lua: raise a lock's fence counter on one Redlock master to at least
-- the fence a majority granted, so this master's next grant of the name is above it.
--
-- KEYS[1]  fence  string: last fence granted (see lock_acquire.lua).
-- ARGV[1]  fence  the Redlock lease's fence (an integer on the microsecond scale).
-- Constants (see lib_lock.lua): FENCE_MEMORY_MS.
--
-- Returns 1 when the counter now stands at ARGV[1] or above (always; a re-sent
-- call changes nothing).

local last = redis.call('GET', KEYS[1])
if not last or tonumber(last) < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', {{FENCE_MEMORY_MS}})
end
return 1
