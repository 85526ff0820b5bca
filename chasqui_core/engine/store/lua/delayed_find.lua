-- Find a delayed job's members at the score its mark holds (delayed.by_mark).
--
-- Members sharing a score are in byte order, and every envelope of a job
-- starts with the same bytes (its "head": the array's length, the version,
-- the id; envelope.id_head), so the job's members sit together among them:
-- their first rank is bisected, one ZRANGE of one rank per step (about 20
-- for a million members of one score), all in this call, so members added
-- or removed meanwhile (the promoter's work) cannot shift the ranks under
-- the search. The comparison is byte by byte, as the set orders members
-- (Lua's own string comparison follows the server's locale).
--
-- KEYS[1] delayed
-- ARGV[1] the score (as the mark holds it)
-- ARGV[2] the id's head
-- ARGV[3] most members to return
-- Returns the members of that score that start with the head, in byte order (usually one).

local delayed, score, head, most = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local count = redis.call('ZCOUNT', delayed, score, score)
if count == 0 then
  return {}
end
local first = redis.call('ZCOUNT', delayed, '-inf', '(' .. score)

-- true when member sorts before head (a member starting with head does not)
local function before(member)
  for i = 1, #head do
    local a, b = string.byte(member, i), string.byte(head, i)
    if a == nil then return true end
    if a ~= b then return a < b end
  end
  return false
end

local low, high = first, first + count  -- the first rank not before head lies in [low, high]
while low < high do
  local mid = math.floor((low + high) / 2)
  if before(redis.call('ZRANGE', delayed, mid, mid)[1]) then
    low = mid + 1
  else
    high = mid
  end
end
local out = {}
if low >= first + count then
  return out
end
for _, member in ipairs(redis.call('ZRANGE', delayed, low, math.min(low + most, first + count) - 1)) do
  if string.sub(member, 1, #head) ~= head then break end
  out[#out + 1] = member
end
return out
