import { FileTypeValidator } from '@nestjs/common';
import { ROOT, run, STEP_TIMEOUT } from './support/consumer.js';

/**
 * `npm ci` warns EBADENGINE on Node 20: two packages in the tree declare `node >=22`. These tests run
 * the code that needs them on the running Node (the suite runs on 20.x, 20.19 or later) to show it works:
 * - file-type@22 (a dependency of @nestjs/common 12) is loaded only by FileTypeValidator, with import();
 * - cookie@2 (ESM only) is require()d by light-my-request, which Fastify loads only for `inject()`;
 *   that require() of an ES module is what needs Node >= 20.19.
 * The library itself uses neither.
 */

const PNG = Buffer.from('89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489', 'hex');

describe(`packages that declare node >=22, on Node ${process.versions.node}`, () => {
  it(
    'file-type@22: FileTypeValidator tells a PNG from bytes that only claim to be one',
    async () => {
      const validator = new FileTypeValidator({ fileType: 'image/png' });
      const file = (buffer: Buffer) => ({ mimetype: 'image/png', size: buffer.length, buffer });
      expect(await validator.isValid(file(PNG))).toBe(true);
      expect(await validator.isValid(file(Buffer.from('GIF89a not a png at all')))).toBe(false);
    },
    STEP_TIMEOUT,
  );

  it(
    'cookie@2: Fastify inject() (light-my-request) parses a Set-Cookie header in a plain Node process',
    async () => {
      // In a child process: jest's module system cannot require() an ES module before Node 24.9, Node can.
      const script = `
      const { createRequire } = require('node:module');
      const fastify = createRequire(require.resolve('@nestjs/platform-fastify/package.json'))('fastify')();
      fastify.get('/cookie', (request, reply) => {
        reply.header('set-cookie', 'session=abc; HttpOnly; Path=/').send('ok');
      });
      fastify.inject({ method: 'GET', url: '/cookie' }).then(async (response) => {
        console.log(JSON.stringify({ status: response.statusCode, body: response.body, cookies: response.cookies }));
        await fastify.close();
      });`;
      const result = await run(process.execPath, ['--input-type=commonjs', '-e', script], ROOT);
      expect(result.stderr).toBe('');
      expect(JSON.parse(result.stdout)).toEqual({
        status: 200,
        body: 'ok',
        cookies: [{ name: 'session', value: 'abc', httpOnly: true, path: '/' }],
      });
    },
    STEP_TIMEOUT,
  );
});
