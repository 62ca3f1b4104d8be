--[[
slurm-gandiva job_submit plugin (JobSubmitPlugins=lua, installed beside slurm.conf).

Jobs whose comment is the controller's mark ("gandiva", or "gandiva:<private directory>" as gandiva sbatch
writes it) belong to the controller:
  * at submission they are held (priority 0) until the controller places and releases them;
  * afterwards nobody but root / SlurmUser may modify them (release, gres, nodelist, ...),
    so a user cannot jump the controller's queue. The owner may still cancel them, and a job's own
    `scontrol requeuehold` (used by gandiva-wrapper to suspend) is a requeue, not a modify.
]]

local MARK = "gandiva"

local function marked(comment)
   return comment ~= nil and (comment == MARK or string.sub(comment, 1, #MARK + 1) == MARK .. ":")
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   if marked(job_desc.comment) then
      job_desc.priority = 0
   end
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   if modify_uid ~= 0 and job_rec ~= nil and marked(job_rec.comment) then
      -- Slurm 22.05 discards slurm.log_user() in job_modify, so the reason goes to slurmctld's log;
      -- the user sees "Access/permission denied" (or "Unspecified error" where that code is unknown).
      slurm.log_info("gandiva: refused uid %u's change to job %u: the gandiva controller manages it",
                     modify_uid, job_rec.job_id)
      return slurm.ESLURM_ACCESS_DENIED or slurm.ERROR
   end
   return slurm.SUCCESS
end

slurm.log_info("slurm-gandiva job_submit.lua loaded")
return slurm.SUCCESS
