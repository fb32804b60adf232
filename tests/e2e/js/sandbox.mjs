// Launches a strata template through the stock E2B JS SDK's Sandbox API and checks what it
// can do: commands (foreground, failing, background + kill, stdin), files, info, list, pause,
// connect (resume), kill.
// Usage: node sandbox.mjs TEMPLATE (E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL set).
// Prints one JSON line of results; exits non-zero on the first failed check.
import { Sandbox, CommandExitError } from 'e2b'

const [template] = process.argv.slice(2)
const check = (ok, what) => {
  if (!ok) {
    console.error(`check failed: ${what}`)
    process.exit(1)
  }
}

const sbx = await Sandbox.create(template, { timeoutMs: 120_000, envs: { FROM_JS: 'yes' }, metadata: { sdk: 'js' } })
const results = { sandboxId: sbx.sandboxId }
try {
  const r = await sbx.commands.run('echo $FROM_JS; whoami; echo err >&2')
  check(r.stdout === 'yes\nuser\n', `stdout ${JSON.stringify(r.stdout)}`)
  check(r.stderr === 'err\n', `stderr ${JSON.stringify(r.stderr)}`)

  let failed = null
  try {
    await sbx.commands.run('exit 7')
  } catch (e) {
    failed = e
  }
  check(failed instanceof CommandExitError && failed.exitCode === 7, `exit 7: ${failed}`)

  const bg = await sbx.commands.run('sleep 60', { background: true })
  const listed = (await sbx.commands.list()).map((p) => p.pid)
  check(listed.includes(bg.pid), `background pid ${bg.pid} in ${listed}`)
  check(await bg.kill(), 'kill answers true')
  let killed = null
  try {
    await bg.wait()
  } catch (e) {
    killed = e
  }
  check(killed instanceof CommandExitError && killed.exitCode === -1, `killed: ${killed}`)

  const cat = await sbx.commands.run('head -n 1', { background: true, stdin: true })
  await sbx.commands.sendStdin(cat.pid, 'from js stdin\n')
  const echoed = await cat.wait()
  check(echoed.stdout === 'from js stdin\n', `stdin ${JSON.stringify(echoed.stdout)}`)

  await sbx.files.write('/home/user/js/note.txt', 'written by js')
  check((await sbx.files.read('/home/user/js/note.txt')) === 'written by js', 'file read back')
  const names = (await sbx.files.list('/home/user/js')).map((e) => e.name)
  check(names.length === 1 && names[0] === 'note.txt', `listing ${names}`)
  check(!(await sbx.files.exists('/home/user/js/missing')), 'missing file')

  const info = await sbx.getInfo()
  check(info.sandboxId === sbx.sandboxId && info.metadata.sdk === 'js', `info ${JSON.stringify(info)}`)
  const paginator = Sandbox.list({ query: { metadata: { sdk: 'js' } } })
  const page = await paginator.nextItems()
  check(page.some((s) => s.sandboxId === sbx.sandboxId), 'listed by metadata')
  check(await sbx.isRunning(), 'running')

  // Pause keeps the filesystem; connect resumes it (on whichever node places it).
  await sbx.files.write('/home/user/js/paused.txt', 'kept through the pause')
  check((await sbx.pause()) === true, 'pause answers true')
  check((await sbx.pause()) === false, 'a second pause answers false (already paused)')
  check(!(await sbx.isRunning()), 'a paused sandbox does not answer')
  const back = await Sandbox.connect(sbx.sandboxId)
  check((await back.files.read('/home/user/js/paused.txt')) === 'kept through the pause', 'file kept through the pause')
  results.resumed = (await back.commands.run('echo resumed')).stdout === 'resumed\n'
} finally {
  results.killed = await sbx.kill()
}
check(results.killed === true, 'kill')
check(!(await sbx.isRunning()), 'not running after kill')
console.log(JSON.stringify(results))
