-- Argo CD health of a Polymorph ModelDeployment (polymorph.dev/v1alpha1), from the kstatus
-- conditions the operator writes (Reconciling, Stalled) and the people-facing ones (Ready,
-- Degraded). Runs with Argo CD's resource.customizations libraries only: no string or math.
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

local function text(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return fallback
end

if obj.status == nil or obj.status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe the ModelDeployment"
  return hs
end
if obj.metadata.generation ~= nil and obj.status.observedGeneration < obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(obj.metadata.generation)
  return hs
end

local stalled = condition("Stalled")
if stalled ~= nil and stalled.status == "True" then
  if stalled.reason == "AnalysisFailed" then
    -- onFailure: Pause: the canary holds until polymorph.dev/approve is set anew, or abort.
    hs.status = "Suspended"
  else
    hs.status = "Degraded"
  end
  hs.message = text(stalled, "Stalled: " .. tostring(stalled.reason))
  return hs
end

local degraded = condition("Degraded")
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = text(degraded, "Degraded: " .. tostring(degraded.reason))
  return hs
end

local reconciling = condition("Reconciling")
if reconciling ~= nil and reconciling.status == "True" then
  if reconciling.reason == "WaitingForApproval" then
    hs.status = "Suspended"
  else
    hs.status = "Progressing"
  end
  hs.message = text(reconciling, "Reconciling: " .. tostring(reconciling.reason))
  return hs
end

local ready = condition("Ready")
if ready == nil or ready.status ~= "True" then
  hs.status = "Progressing"
  hs.message = text(ready, "Waiting for the serving replicas")
  return hs
end

hs.status = "Healthy"
local build = obj.status.activeBuild
if build ~= nil and (build.shortId ~= nil or build.id ~= nil) then
  hs.message = "Serving " .. tostring(build.shortId or build.id) .. ": " .. text(ready, "replicas ready")
else
  hs.message = text(ready, "Serving")
end
return hs
