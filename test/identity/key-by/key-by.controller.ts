import { Controller, type ExecutionContext, Get } from '@nestjs/common';
import { RateLimit } from 'nest-redis-rate-limit';

const tenant = (context: ExecutionContext) => context.switchToHttp().getRequest().headers['x-tenant'];

@Controller('by')
export class KeyByController {
  @Get('ip')
  @RateLimit(2, 0.01, 'ip')
  ip() {
    return { ok: true };
  }

  @Get('user')
  @RateLimit(2, 0.01, 'user')
  user() {
    return { ok: true };
  }

  @Get('api-key')
  @RateLimit(2, 0.01, 'apiKey')
  apiKey() {
    return { ok: true };
  }

  @Get('tenant')
  @RateLimit(2, 0.01, tenant)
  tenant() {
    return { ok: true };
  }

  @Get('shared-a')
  @RateLimit({ capacity: 3, refillPerSecond: 0.01, keyBy: 'apiKey', name: 'shared' })
  sharedA() {
    return { ok: true };
  }

  @Get('shared-b')
  @RateLimit({ capacity: 3, refillPerSecond: 0.01, keyBy: 'apiKey', name: 'shared' })
  sharedB() {
    return { ok: true };
  }
}
