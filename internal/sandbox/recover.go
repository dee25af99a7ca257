package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/image"
)

// recover loads the database, reattaches to sandboxes that were running,
// and removes what the host holds that the database does not know.
func (m *Manager) recover(ctx context.Context) error {
	rows, err := m.db.QueryContext(ctx, `SELECT id, namespace, name, state, error, spec, image_id, created, started, stopped FROM sandboxes`)
	if err != nil {
		return fmt.Errorf("load sandboxes: %w", err)
	}
	var loaded []*entry
	for rows.Next() {
		var (
			e                         entry
			state                     string
			spec                      []byte
			created, started, stopped int64
		)
		if err := rows.Scan(&e.id, &e.ns, &e.name, &state, &e.err, &spec, &e.imageID, &created, &started, &stopped); err != nil {
			_ = rows.Close()
			return fmt.Errorf("load sandboxes: %w", err)
		}
		if err := json.Unmarshal(spec, &e.spec); err != nil {
			e.err = "unreadable spec: " + err.Error()
			state = string(Error)
		}
		if e.spec.Isolation == "" {
			e.spec.Isolation = m.legacyTier()
		}
		e.state = State(state)
		e.created, e.started, e.stopped = fromUnixNano(created), fromUnixNano(started), fromUnixNano(stopped)
		e.lastActive.Store(time.Now().UnixNano())
		loaded = append(loaded, &e)
	}
	_ = rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("load sandboxes: %w", err)
	}
	known := map[string]bool{}
	for _, e := range loaded {
		if e.state == removingState {
			// A remove the last daemon acknowledged no answer for, or
			// did: either way the client asked for it. What is left on
			// the host goes with the orphans below.
			if _, err := m.stmts.Exec(ctx, `DELETE FROM sandboxes WHERE id = ?`, e.id); err != nil {
				return fmt.Errorf("finish removing sandbox %s: %w", e.id, err)
			}
			removeLog(m.opts.LogDir, e.id)
			m.log.Info("sandbox removal finished after a restart", "namespace", e.ns, "name", e.name, "id", e.id)
			continue
		}
		known[e.id] = true
		e.log = openLog(m.opts.LogDir, e.id)
		m.entries[key{e.ns, e.name}] = e
		if e.state == Stopped || e.state == Error {
			continue
		}
		// It was starting, running or stopping when the last daemon
		// ended: running now only if its agent still is.
		was := e.state
		be, err := m.backendOf(e.spec)
		var img *image.Image
		if err == nil {
			img, err = m.image(ctx, e, e.spec.Image)
		}
		var sb backend.Sandbox
		if err == nil {
			sb, err = be.Open(ctx, m.config(e.ns, e.spec, e.id, img))
		}
		switch {
		case err != nil:
			e.state, e.err = Error, "reattach after restart: "+err.Error()
		case !isRunning(sb) && !be.Capabilities().Reattach:
			// Its backend ended it with the last server (Open released
			// what was left of it): said as such, not as a crash.
			e.sb = sb
			e.state, e.stopped = Error, time.Now()
			e.err = "isolation " + e.spec.Isolation + " sandboxes do not outlive the server that started them: stopped at the server's restart (was " + string(was) + "; start it again, its files are kept)"
		case !isRunning(sb):
			e.sb = sb
			e.state, e.stopped = Error, time.Now()
			e.err = "the sandbox's agent was not running when the daemon restarted (was " + string(was) + ")"
		case was == Running:
			e.sb = sb
			m.restorePaused(e, sb)
			e.wsHeld = e.spec.Workspace != "" // its mount lives on with it
			e.usage.reset(sb, time.Now())
			if err := m.restoreSecrets(ctx, e); err != nil {
				e.logf("reattached after a daemon restart without its proxy-mode secrets (their placeholders go as they are until the next start): %v", err)
			}
			if err := m.netUp(e, sb); err != nil {
				e.logf("reattached after a daemon restart, without its network policy: %v", err)
			} else {
				e.logf("reattached after a daemon restart (paused: %v)", e.paused)
				m.republish(e)
			}
			m.watch(e, sb)
		default:
			// Half-started or half-stopped: finish the stop.
			e.sb = sb
			_ = sb.Stop(ctx)
			e.wsHeld = e.spec.Workspace != ""
			m.workspaceDown(ctx, e)
			e.state, e.stopped = Stopped, time.Now()
		}
		m.persist(e)
		m.log.Info("sandbox recovered", "namespace", e.ns, "name", e.name, "id", e.id, "state", e.state, "was", was)
	}
	m.sweepSecrets()
	for _, name := range slices.Sorted(maps.Keys(m.tiers)) {
		be := m.tiers[name].Backend
		ids, err := be.IDs()
		if err != nil {
			return fmt.Errorf("list %s sandboxes on the host: %w", name, err)
		}
		for _, id := range ids {
			if known[id] {
				continue
			}
			if err := m.removeOnHost(ctx, name, id); err != nil {
				m.log.Warn("remove orphaned sandbox", "id", id, "isolation", name, "err", err)
				continue
			}
			removeLog(m.opts.LogDir, id)
			m.log.Info("orphaned sandbox removed", "id", id, "isolation", name)
		}
		if _, err := be.ReapOrphans(func(id string) bool { return known[id] }); err != nil {
			m.log.Warn("reap orphans", "isolation", name, "err", err)
		}
	}
	return nil
}

// legacyTier is the tier of a sandbox recorded before sandboxes had one:
// native, the only one then, or the default where the server has no
// native tier (a test's fake backend).
func (m *Manager) legacyTier() string {
	if _, ok := m.tiers[legacyTier]; ok {
		return legacyTier
	}
	if _, ok := m.opts.TiersOff[legacyTier]; ok {
		return legacyTier
	}
	return m.DefaultTier()
}

// isRunning reports whether sb's init runs.
func isRunning(sb backend.Sandbox) bool {
	select {
	case <-sb.Done():
		return false
	default:
		return true
	}
}
