-- Renew or release a leader lock, only by the holder that owns it
-- (compare-and-expire, compare-and-delete).
--
-- KEYS[1] the lock key
-- ARGV[1] "renew" or "release"
-- ARGV[2] holder id
-- ARGV[3] new time-to-live in ms (renew only)
-- Returns 1 when the holder owned the lock (and it was renewed or released), else 0.

if redis.call('GET', KEYS[1]) ~= ARGV[2] then
  return 0
end
if ARGV[1] == 'renew' then
  return redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return redis.call('DEL', KEYS[1])
