import { Controller, Get, Param } from '@nestjs/common';
import { ConcurrencyLimit, RateLimit } from 'nest-redis-rate-limit';
import { Gates } from '../../policies/concurrency/concurrency.controller.js';

/** Requests of the slots route wait here until the test lets them go. */
export const clusterGates = new Gates();

/** One token per 100 s: counts cannot move while a test runs. */
export const SLOW = 0.01;

@Controller('cluster')
export class ClusterController {
  @Get('single')
  @RateLimit(3, SLOW)
  single() {
    return { ok: true };
  }

  /** Same identity: both keys share the hash tag and are decided in one script on one node. */
  @Get('double')
  @RateLimit({ capacity: 10, refillPerSecond: SLOW, name: 'c-burst' })
  @RateLimit({ capacity: 3, refillPerSecond: SLOW, name: 'c-quota' })
  double() {
    return { ok: true };
  }

  /** Different identities (IP, then API key): two hash tags, decided group by group and compensated. */
  @Get('mixed')
  @RateLimit({ capacity: 10, refillPerSecond: SLOW, keyBy: 'ip', name: 'c-ip' })
  @RateLimit({ capacity: 3, refillPerSecond: SLOW, keyBy: 'apiKey', name: 'c-key' })
  mixed() {
    return { ok: true };
  }

  @Get('per-key')
  @RateLimit({ capacity: 5, refillPerSecond: SLOW, keyBy: 'apiKey', name: 'c-per-key' })
  perKey() {
    return { ok: true };
  }

  /** One request in flight per API key, after a rate policy on the same identity: both keys share its hash tag. */
  @Get('slots/:id')
  @RateLimit({ capacity: 5, refillPerSecond: SLOW, keyBy: 'apiKey', name: 'c-slots-rate' })
  @ConcurrencyLimit({ limit: 1, keyBy: 'apiKey', name: 'c-slots' })
  async slots(@Param('id') id: string) {
    await clusterGates.gate(id);
    return { ok: true };
  }

  /** As `slots`, with the rate policy after the app's guards as the slot is: one script call takes both, on the master owning the key's tag. */
  @Get('together/:id')
  @RateLimit({ capacity: 5, refillPerSecond: SLOW, keyBy: 'apiKey', name: 'c-together-rate', phase: 'after-guards' })
  @ConcurrencyLimit({ limit: 1, keyBy: 'apiKey', name: 'c-together' })
  async together(@Param('id') id: string) {
    await clusterGates.gate(id);
    return { ok: true };
  }

  /** The rate policy per address, the slot per API key, both after the guards: two hash tags, so a take, a slot, and a refund when the slot is refused. */
  @Get('apart/:id')
  @RateLimit({ capacity: 5, refillPerSecond: SLOW, keyBy: 'ip', name: 'c-apart-rate', phase: 'after-guards' })
  @ConcurrencyLimit({ limit: 1, keyBy: 'apiKey', name: 'c-apart' })
  async apart(@Param('id') id: string) {
    await clusterGates.gate(id);
    return { ok: true };
  }
}
