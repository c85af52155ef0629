import { Injectable, Module, UnauthorizedException } from '@nestjs/common';
import { JwtModule } from '@nestjs/jwt';
import { PassportModule, PassportStrategy } from '@nestjs/passport';
import { ExtractJwt, Strategy as JwtStrategy } from 'passport-jwt';
import { Strategy as LocalStrategy } from 'passport-local';

/** Signs the tokens of the test users; never a real secret. */
export const JWT_SECRET = 'identity-test-secret-not-for-production';

/** The users the local strategy knows, with their passwords. */
export const USERS: Record<string, string> = { alice: 'alice-pw', bob: 'bob-pw', carol: 'carol-pw' };

/** passport-local: username and password from the body; a wrong pair is a 401. */
@Injectable()
export class PasswordStrategy extends PassportStrategy(LocalStrategy) {
  validate(username: string, password: string) {
    if (USERS[username] !== password) throw new UnauthorizedException();
    return { id: username };
  }
}

/** passport-jwt: a bearer token signed with JWT_SECRET sets `req.user = { id: sub }`. */
@Injectable()
export class TokenStrategy extends PassportStrategy(JwtStrategy) {
  constructor() {
    super({ jwtFromRequest: ExtractJwt.fromAuthHeaderAsBearerToken(), secretOrKey: JWT_SECRET });
  }

  validate(payload: { sub: string }) {
    return { id: payload.sub };
  }
}

/** Passport with both strategies, as an app would have it. */
@Module({
  imports: [PassportModule, JwtModule.register({ secret: JWT_SECRET })],
  providers: [PasswordStrategy, TokenStrategy],
  exports: [JwtModule],
})
export class AuthModule {}
