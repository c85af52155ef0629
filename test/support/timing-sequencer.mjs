/**
 * The order of the `timing` project's files (jest.config.js). Its files run two at a time, in this order:
 * a file runs beside the ones next to it. The heavy ones (several app processes, a Sentinel with three
 * failovers at once) are spread out, first, a third of the way and two thirds of the way, so that none
 * runs beside another: side by side on two cores, each starved the other (a fresh clone's `.ci/run` on
 * 2026-12-06, where jest, with no durations cached, started the two largest files, both multi-process,
 * together: the leases' churn could not reach its surge and the Sentinel switch came late). Otherwise
 * jest's own order (failed first, then the longest).
 */
import Sequencer from '@jest/test-sequencer';

const BaseSequencer = Sequencer.default ?? Sequencer;

const HEAVY = ['/leases-multi-process.timing.', '/concurrency-multi-process.timing.', '/sentinel-failover.timing.'];

export default class TimingSequencer extends BaseSequencer {
  async sort(tests) {
    const sorted = await super.sort(tests);
    const heavy = sorted.filter((test) => HEAVY.some((name) => test.path.includes(name)));
    const order = sorted.filter((test) => !heavy.includes(test));
    const total = sorted.length;
    heavy.forEach((test, i) => order.splice(Math.floor((i * total) / heavy.length), 0, test));
    return order;
  }
}
