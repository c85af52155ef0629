import { Body, Controller, HttpCode, Post } from '@nestjs/common';
import { RateLimit } from 'nest-redis-rate-limit';

@Controller('auth')
export class AuthController {
  /** Hard per-IP limit against password guessing: 5 attempts, then one more every 12 seconds (5 per minute). */
  @Post('login')
  @HttpCode(200)
  @RateLimit(5, 5 / 60, 'ip')
  login(@Body() body: { username?: string }) {
    return { ok: true, user: typeof body?.username === 'string' ? body.username : 'anonymous' };
  }
}
