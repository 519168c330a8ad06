"""Pure (sans-IO) scheduling policies: no trio, no llama. The step (step.py) is one generator of effects;
the actors are thin drivers of it."""

from .admission import Admission, SeqIdPool, fcfs_priority
from .composer import Chunk, Composer, StepPlan
from .lanes import LanePlan, plan_lanes
from .memory import Headroom
from .preemption import Preemption, fewest_outputs_first, newest_first
from .requests import FinishReason, Request, RequestState, TokenEvent, Usage
from .step import StepScheduler

__all__ = [
    "Admission", "Chunk", "Composer", "FinishReason", "Headroom", "LanePlan", "Preemption", "Request",
    "RequestState", "SeqIdPool", "StepPlan", "StepScheduler", "TokenEvent", "Usage", "fcfs_priority", "fewest_outputs_first",
    "newest_first", "plan_lanes",
]
