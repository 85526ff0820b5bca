-- Read the server's clock, on the node that serves a key.
--
-- A plain pipeline reads the clock with TIME. A Redis Cluster pipeline
-- cannot carry a command without a key (which node would answer it?), so
-- there the clock is read by this script, sent with a key whose node's
-- clock is wanted; the key itself is not touched.
--
-- KEYS[1] any key on the node whose clock is read
-- ARGV    none
-- Returns the TIME reply: {seconds, microseconds}

return redis.call('TIME')
