-- Fragment: batch_entry(batch, key, new): what the table batch collects for key, made by new()
-- when key first comes; batch also lists its keys in the order they first came (batch[1],
-- batch[2], ...), the order its flush writes them in. The batches that make a script's writes
-- once per key (a list's pushes, a zset's leases: runs_pushes, runs_leases) keep their keys so.
local function batch_entry(batch, key, new)
  local entry = batch[key]
  if not entry then
    entry = new()
    batch[key] = entry
    batch[#batch + 1] = key
  end
  return entry
end
