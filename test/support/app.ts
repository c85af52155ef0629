import type { INestApplication, Type } from '@nestjs/common';
import { FastifyAdapter, type NestFastifyApplication } from '@nestjs/platform-fastify';
import { Test } from '@nestjs/testing';

/** Nest's two HTTP platforms: every HTTP scenario runs on both. */
export const PLATFORMS = ['express', 'fastify'] as const;
export type Platform = (typeof PLATFORMS)[number];

/** Compiles `module` and starts it on `platform`, ready for supertest on `app.getHttpServer()`. */
export async function createApp(
  module: Type | ReturnType<typeof Object>,
  platform: Platform,
  configure?: (app: INestApplication) => void,
): Promise<INestApplication> {
  const moduleRef = await Test.createTestingModule({ imports: [module] }).compile();
  const app =
    platform === 'fastify'
      ? moduleRef.createNestApplication<NestFastifyApplication>(new FastifyAdapter(), { logger: false })
      : moduleRef.createNestApplication({ logger: false });
  configure?.(app);
  await app.init();
  if (platform === 'fastify') await (app as NestFastifyApplication).getHttpAdapter().getInstance().ready();
  return app;
}
