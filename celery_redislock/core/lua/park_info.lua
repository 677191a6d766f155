-- park_info.lua: read a pool's parked runs without changing anything.
--
-- KEYS[1]  parked    zset: parked entry ids scored by ticket (server µs).
-- KEYS[2]  claimed   zset: claimed entry ids scored by reservation expiry (ms).
-- KEYS[3]  dead      list: dead-lettered entries (see park_return.lua).
-- KEYS[4]  payloads  hash: "o:<id>" owner of each parked or claimed entry.
-- ARGV[1]  count     how many of the oldest parked entries to list (integer >= 0).
-- ARGV[2]  claimed   "1": also list the claimed entries; "0" or absent: not.
--
-- Returns {now_us, parked, oldest ticket (µs) or "", claimed, dead,
-- {id, ticket, owner, ...} of the first `count` parked entries,
-- {id, owner, ...} of the claimed entries (empty unless ARGV[2] is "1")}.

local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local first = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1, 'WITHSCORES')
local rows = {}
for i = 1, #first, 2 do
  rows[#rows + 1] = first[i]
  rows[#rows + 1] = first[i + 1]
  rows[#rows + 1] = redis.call('HGET', KEYS[4], 'o:' .. first[i]) or ''
end
local oldest = ''
if first[2] then oldest = first[2] end
if tonumber(ARGV[1]) == 0 then
  local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if head[2] then oldest = head[2] end
end
local claimed = {}
if ARGV[2] == '1' then
  for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    claimed[#claimed + 1] = id
    claimed[#claimed + 1] = redis.call('HGET', KEYS[4], 'o:' .. id) or ''
  end
end
return {string.format('%d', now_us), redis.call('ZCARD', KEYS[1]), oldest,
  redis.call('ZCARD', KEYS[2]), redis.call('LLEN', KEYS[3]), rows, claimed}
