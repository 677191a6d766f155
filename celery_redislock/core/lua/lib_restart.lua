-- lib_restart.lua: the restart grace's helpers (see core/restart.py), inlined by
-- "--!include lib_restart.lua" into the semaphore scripts that hand permits out or
-- renew. Not a script of its own, and calls no other lib's helpers: a script
-- includes it alone inside its `if grace then` block, so without a grace its helpers
-- are never made (each helper defined is a closure made on every run, see
-- scripts.py); the code after the block includes what it needs again.

-- Restart grace (see core/restart.py). A Redis that lost its data (restarted empty,
-- flushed) forgot every lease, while their holders may still run. Every client that
-- sends a grace sets its prefix's boot marker "<prefix>:boot" (the server µs it was
-- set, no expiry) before its first such call, so a script sent a grace that finds the
-- marker missing knows the data was lost since. It sets the marker again and, while
-- the server is younger than the grace, sets "<prefix>:boot:grace" to expire when the
-- server is `grace` ms old: until then permits go back to holders from before the
-- loss first (hold_for_restart, reregister_permit below). Both keys
-- are named after the holders key's prefix: a standalone server's keys (on Redis
-- Cluster they are in another slot: no grace is sent there).
local function boot_keys(holders)
  local kind = string.sub(holders, 1, string.find(holders, '{', 1, true) - 2)
  local prefix = string.match(kind, '^(.*):[^:]*$')
  return prefix .. ':boot', prefix .. ':boot:grace'
end

-- The server's age in ms, never more than it is (a grace measured by it never ends
-- early). INFO's uptime is the difference of two rounded-down wall clock seconds (now
-- and the start), so it reads 1 as little as a millisecond after the start: one
-- second less (measured: a grace of 2 s ended 1.3 s after a restart without it).
-- Redis counts it on the wall clock: a clock stepped back after the start makes it
-- negative, taken as 0 (the longest grace; a pattern of digits alone would fail the
-- script).
local function server_age_ms()
  local info = redis.call('INFO', 'server')
  return math.max(0, tonumber(string.match(info, 'uptime_in_seconds:(-?%d+)')) - 1) * 1000
end

-- The restart grace left (ms, 0: none) for the primitive of `holders`, with `grace`
-- (ms) the caller's; marks a server found without its marker (see above). Returns
-- also the marker (the server µs the data loss was found) while a grace is left.
local function restart_grace(holders, grace, now_us)
  local boot, hold = boot_keys(holders)
  local n = redis.call('EXISTS', hold, boot, boot)
  if n == 2 then return 0 end
  if n > 2 then return redis.call('PTTL', hold), redis.call('GET', boot) end
  local marker = string.format('%d', now_us)
  redis.call('SET', boot, marker)
  local left = grace - server_age_ms()
  if left <= 0 then return 0 end
  if redis.call('PTTL', hold) < left then redis.call('SET', hold, marker, 'PX', left) end
  return left, marker
end

-- Within a restart grace (restart_grace above) the permits not taken back yet by
-- holders from before the data loss are held by placeholders "~restart:<i>" expiring
-- with the grace (`left` ms): every path that hands permits out counts them, so none
-- goes to a newcomer until each holder renewed (reregister_permit) or the grace
-- ended. The first call fills the semaphore up to its `limit`; a later one with a
-- higher limit (a sweeper's pump knows none after the loss) adds the difference. The
-- leases hash's "~restart" field keeps "<marker> <limit filled to>".
local function hold_for_restart(holders, leases, limit, left, now, marker)
  local filled = 0
  local done = redis.call('HGET', leases, '~restart')
  if done and string.match(done, '^(%d+) ') == marker then
    filled = tonumber(string.match(done, ' (%d+)$'))
  end
  if filled >= limit then return end
  local first, last = filled + 1, limit
  if filled == 0 then
    last = limit - redis.call('ZCOUNT', holders, string.format('(%d', now), '+inf')
  end
  local expiry = string.format('%d', now + left)
  for i = first, last do redis.call('ZADD', holders, expiry, '~restart:' .. i) end
  redis.call('HSET', leases, '~restart', marker .. ' ' .. string.format('%d', limit))
  for _, key in ipairs({holders, leases}) do
    if redis.call('PTTL', key) < left then redis.call('PEXPIRE', key, left + 1000) end
  end
end

-- Put back a live lease that a data loss forgot (its renewal found it missing):
-- `token` with its own `fence` and `owner`, expiring `ttl` ms from now, in the place
-- of a placeholder when one is left (as grant_permit in lib_semaphore.lua writes a
-- lease; "s:" is the grant time its fence tells). Returns false, putting nothing back,
-- when placeholders were filled for this loss (`marker`) and none is left: the permits
-- went to holders that renewed first or, once a placeholder expired, to newcomers,
-- and one more lease would exceed the limit.
local function reregister_permit(holders, leases, token, owner, ttl, now, fence, marker)
  local placeholder = false
  for _, t in ipairs(redis.call('ZRANGE', holders, 0, -1)) do
    if string.sub(t, 1, 9) == '~restart:' then
      redis.call('ZREM', holders, t)
      placeholder = true
      break
    end
  end
  if not placeholder then
    local done = redis.call('HGET', leases, '~restart')
    if done and string.match(done, '^(%d+) ') == marker then return false end
  end
  redis.call('ZADD', holders, string.format('%d', now + ttl), token)
  redis.call('HSET', leases, 'f:' .. token, fence, 'o:' .. token, owner,
    's:' .. token, string.format('%d', math.floor(tonumber(fence) / 1000)))
  for _, key in ipairs({holders, leases}) do
    if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl + 1000) end
  end
  return true
end

-- After a data loss the fence key is gone and a new fence is the server's µs clock,
-- which may be behind the lost server's (a clock stepped back, a VM restored): a
-- lease granted before the loss, put back or not, tells its `fence` when it renews
-- within the grace, and the fence key is raised to it so later grants go above
-- (next_fence in lib_lock.lua: max(last + 1, now)).
local function raise_fence(holders, fence)
  local key = string.sub(holders, 1, -8) .. 'fence'
  if tonumber(redis.call('GET', key) or 0) < tonumber(fence) then
    redis.call('SET', key, fence, 'PX', {{FENCE_MEMORY_MS}})
  end
end

-- Put back a live lock lease that a data loss forgot (its renewal found it missing):
-- `token` with its own `fence` and `owner`, expiring `ttl` ms from now, when the lock
-- is free or held by the same owner (its other leases, put back first); as
-- grant_lock in lib_lock.lua writes it. Returns 1 when put back, 0 when another owner
-- holds the lock (taken before the holder renewed: it stays lost).
local function reregister_lock(holders, token, owner, ttl, now, fence)
  local holder = redis.call('HGET', holders, 'owner')
  if holder and holder ~= owner then return 0 end
  local expiry = string.format('%d', now + ttl)
  if not holder then
    redis.call('HSET', holders, 'owner', owner, 'fence', fence,
      'since', string.format('%d', math.floor(tonumber(fence) / 1000)))
  end
  redis.call('HSET', holders, 't:' .. token, expiry, 'f:' .. token, fence)
  if redis.call('PTTL', holders) < ttl then redis.call('PEXPIREAT', holders, expiry) end
  return 1
end
