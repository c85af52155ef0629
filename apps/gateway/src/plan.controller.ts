import { Controller, Get, Req, UseGuards } from '@nestjs/common';
import { RateLimit } from 'nest-redis-rate-limit';
import { DemoUserGuard, PlanLimits } from './plans.js';

@Controller('api')
export class PlanController {
  /**
   * A budget per user from their plan (pro: 20, then 2/s; free: 5, then one every 2 s), looked up by an
   * injected resolver and cached for a second per user. Try `curl -H 'x-user: ann' localhost:3000/api/plan`.
   */
  @Get('plan')
  @UseGuards(DemoUserGuard)
  @RateLimit({ resolve: PlanLimits, keyBy: 'user', capacity: 5, refillPerSecond: 0.5 })
  plan(@Req() request: { user?: { id: string; plan: string } }) {
    return { user: request.user?.id ?? null, plan: request.user?.plan ?? 'anonymous' };
  }
}
