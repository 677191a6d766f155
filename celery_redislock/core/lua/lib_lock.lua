-- lib_lock.lua: helpers inlined into the lock scripts by "--!include lib_lock.lua".
-- Not a script of its own. Numbers go to Redis through %d: Lua's tostring would
-- print a microsecond clock as 1.7e+15.

-- The server's clock: milliseconds and microseconds since the epoch.
local function server_clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000),
    tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Next fence of a name: max(last + 1, now in µs), so fences keep increasing even
-- if the fence key (kept `memory` ms after each grant) is lost.
local function next_fence(fence_key, now_us, memory)
  local last = tonumber(redis.call('GET', fence_key) or '0')
  local fence = string.format('%d', math.max(last + 1, now_us))
  redis.call('SET', fence_key, fence, 'PX', memory)
  return fence
end

-- Drop expired leases of a holders hash; fit its PEXPIRE to the longest live lease
-- (or delete it). Returns the number of live leases and the longest expiry (ms).
local function sweep_leases(holders, now)
  local fields = redis.call('HGETALL', holders)
  local live, longest = 0, 0
  for i = 1, #fields, 2 do
    local name = fields[i]
    if string.sub(name, 1, 2) == 't:' then
      local expiry = tonumber(fields[i + 1])
      if expiry <= now then
        redis.call('HDEL', holders, name, 'f:' .. string.sub(name, 3))
      else
        live = live + 1
        if expiry > longest then longest = expiry end
      end
    end
  end
  if live == 0 then
    redis.call('DEL', holders)
  else
    redis.call('PEXPIRE', holders, longest - now)
  end
  return live, longest
end

-- Live lease of `token` in a holders hash: its fence, or nil.
local function live_fence(holders, token, now)
  local expiry = redis.call('HGET', holders, 't:' .. token)
  if expiry and tonumber(expiry) > now then
    return tonumber(redis.call('HGET', holders, 'f:' .. token))
  end
  return nil
end

-- Drop waiters whose heartbeat lapsed; the queue's first token before and after.
local function reap_waiters(queue, alive, now)
  local before = redis.call('ZRANGE', queue, 0, 0)[1]
  for _, t in ipairs(redis.call('ZRANGEBYSCORE', alive, '-inf', now)) do
    redis.call('ZREM', queue, t)
    redis.call('ZREM', alive, t)
  end
  return before, redis.call('ZRANGE', queue, 0, 0)[1]
end
