/* pdctl_plan.c - the SLO planner's controller (stub while the core lands). */
#include "pdctl.h"
#include "pdctl_plan.h"
