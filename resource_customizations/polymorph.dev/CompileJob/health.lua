-- Argo CD health of a Polymorph CompileJob (polymorph.dev/v1alpha1): Progressing while the
-- campaign is Pending or Running, Healthy once it Succeeded (with or without a better build),
-- Degraded when it Failed. Runs with Argo CD's resource.customizations libraries only.
local hs = {}

local function condition(kind)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function message(fallback)
  if obj.status.message ~= nil and obj.status.message ~= "" then
    return obj.status.message
  end
  return fallback
end

if obj.status == nil or obj.status.phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to start the campaign"
  return hs
end
if obj.metadata.generation ~= nil and obj.status.observedGeneration ~= nil
    and obj.status.observedGeneration < obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(obj.metadata.generation)
  return hs
end

local phase = obj.status.phase
local stalled = condition("Stalled")
if phase == "Failed" or (stalled ~= nil and stalled.status == "True") then
  hs.status = "Degraded"
  if stalled ~= nil and stalled.message ~= nil and stalled.message ~= "" then
    hs.message = stalled.message
  else
    hs.message = message("The campaign failed")
  end
  return hs
end
if phase == "Succeeded" then
  hs.status = "Healthy"
  local best = obj.status.best
  if best ~= nil and best.build ~= nil and best.speedup ~= nil then
    local x = best.speedup * 100 + 0.5
    hs.message = "Best build " .. best.build .. " at " .. tostring((x - x % 1) / 100) .. "x"
  else
    hs.message = message("No build beat the baseline")
  end
  return hs
end
if phase == "Cancelled" then
  hs.status = "Healthy"
  hs.message = message("The campaign was cancelled")
  return hs
end
hs.status = "Progressing"
hs.message = message("The campaign is " .. phase)
return hs
