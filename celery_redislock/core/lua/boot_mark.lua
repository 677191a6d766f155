-- boot_mark.lua: set a prefix's boot marker unless it is there (see restart_grace in
-- lib_restart.lua): a client does so once before its first call with a restart grace,
-- so a later call that finds the marker missing knows the data was lost since.
--
-- KEYS[1]  boot     string "<prefix>:boot": the server µs it was set; no expiry.
--
-- Returns 1 when it was set now, 0 when it was there.

local t = redis.call('TIME')
local now_us = string.format('%d', tonumber(t[1]) * 1000000 + tonumber(t[2]))
if redis.call('SET', KEYS[1], now_us, 'NX') then return 1 end
return 0
