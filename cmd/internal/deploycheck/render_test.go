package deploycheck

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// repoRoot is the checkout this package lies in.
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller information")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// kustomizations are the directories an operator applies with kubectl -k.
var kustomizations = []string{"base", "overlays/single-node", "overlays/fake-inference"}

// objects is one rendered kustomization, decoded.
type objects struct {
	configMaps   map[string]*corev1.ConfigMap
	secrets      map[string]*corev1.Secret
	services     map[string]*corev1.Service
	pvcs         map[string]*corev1.PersistentVolumeClaim
	deployments  map[string]*appsv1.Deployment
	statefulSets map[string]*appsv1.StatefulSet
	jobs         map[string]*batchv1.Job
	namespaces   map[string]bool
}

// render builds dir (under deploy/k8s) with kustomize and decodes every
// object strictly into its API type: a field the type lacks, or a value
// of the wrong type, fails.
func render(t *testing.T, dir string) *objects {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join(repoRoot(t), "deploy", "k8s", dir))
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	o := &objects{
		configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{},
		services: map[string]*corev1.Service{}, pvcs: map[string]*corev1.PersistentVolumeClaim{},
		deployments: map[string]*appsv1.Deployment{}, statefulSets: map[string]*appsv1.StatefulSet{},
		jobs: map[string]*batchv1.Job{}, namespaces: map[string]bool{},
	}
	for _, r := range m.Resources() {
		b, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		kind, api, name := r.GetKind(), r.GetApiVersion(), r.GetName()
		where := fmt.Sprintf("%s: %s %s", dir, kind, name)
		slot, ok := slots[api+"/"+kind]
		if !ok {
			t.Errorf("%s: apiVersion %s kind %s is not one this check knows", where, api, kind)
			continue
		}
		obj := slot(o, name)
		if err := yaml.UnmarshalStrict(b, obj); err != nil {
			t.Errorf("%s does not decode strictly as %s: %v", where, kind, err)
		}
		for _, msg := range validation.IsDNS1123Subdomain(name) {
			t.Errorf("%s: name: %s", where, msg)
		}
		o.namespaces[r.GetNamespace()] = true
	}
	return o
}

// slots are where render decodes an object of each apiVersion/kind: a
// new entry of name in its map of o.
var slots = map[string]func(o *objects, name string) any{
	"v1/ConfigMap":             func(o *objects, n string) any { return add(o.configMaps, n) },
	"v1/Secret":                func(o *objects, n string) any { return add(o.secrets, n) },
	"v1/Service":               func(o *objects, n string) any { return add(o.services, n) },
	"v1/PersistentVolumeClaim": func(o *objects, n string) any { return add(o.pvcs, n) },
	"apps/v1/Deployment":       func(o *objects, n string) any { return add(o.deployments, n) },
	"apps/v1/StatefulSet":      func(o *objects, n string) any { return add(o.statefulSets, n) },
	"batch/v1/Job":             func(o *objects, n string) any { return add(o.jobs, n) },
}

func add[T any](m map[string]*T, name string) *T {
	v := new(T)
	m[name] = v
	return v
}

// eachRendering renders every kustomization and runs check on it in a
// subtest of its own.
func eachRendering(t *testing.T, check func(t *testing.T, dir string, o *objects)) {
	t.Helper()
	for _, dir := range kustomizations {
		t.Run(dir, func(t *testing.T) { check(t, dir, render(t, dir)) })
	}
}

// pod is a workload's pod template and the name of its first pod.
type pod struct {
	where, name string
	spec        corev1.PodSpec
	labels      map[string]string
}

func (o *objects) pods() []pod {
	var out []pod
	for n, d := range o.deployments {
		out = append(out, pod{"Deployment " + n, n + "-x", d.Spec.Template.Spec, d.Spec.Template.Labels})
	}
	for n, s := range o.statefulSets {
		out = append(out, pod{"StatefulSet " + n, n + "-0", s.Spec.Template.Spec, s.Spec.Template.Labels})
	}
	for n, j := range o.jobs {
		out = append(out, pod{"Job " + n, n + "-x", j.Spec.Template.Spec, j.Spec.Template.Labels})
	}
	return out
}

func TestManifests_RenderAndDecodeStrictly(t *testing.T) {
	eachRendering(t, func(t *testing.T, dir string, o *objects) {
		if len(o.statefulSets) != 4 || len(o.jobs) != 1 || len(o.pvcs) != 1 {
			t.Errorf("%d StatefulSets, %d Jobs, %d PVCs; want the four participants' StatefulSets, the collector's Job and the shared claim",
				len(o.statefulSets), len(o.jobs), len(o.pvcs))
		}
		if dir != "base" && (len(o.namespaces) != 1 || o.namespaces[""]) {
			t.Errorf("namespaces %v: an overlay puts everything in one namespace", o.namespaces)
		}
	})
}

// TestManifests_ReferencesResolve checks that what a pod names exists in
// the same rendering: ConfigMaps, Secrets and their keys, claims, the
// headless Service of each StatefulSet, and a Service with pods behind it.
func TestManifests_ReferencesResolve(t *testing.T) {
	eachRendering(t, func(t *testing.T, dir string, o *objects) {
		for _, p := range o.pods() {
			claims := map[string]bool{}
			for _, v := range p.spec.Volumes {
				switch {
				case v.ConfigMap != nil:
					if o.configMaps[v.ConfigMap.Name] == nil {
						t.Errorf("%s: volume %s: no ConfigMap %s", p.where, v.Name, v.ConfigMap.Name)
					}
				case v.Secret != nil:
					s := o.secrets[v.Secret.SecretName]
					if s == nil {
						t.Errorf("%s: volume %s: no Secret %s", p.where, v.Name, v.Secret.SecretName)
						continue
					}
					for _, it := range v.Secret.Items {
						if _, ok := s.StringData[it.Key]; !ok {
							t.Errorf("%s: volume %s: Secret %s has no key %s", p.where, v.Name, s.Name, it.Key)
						}
					}
				case v.PersistentVolumeClaim != nil:
					claims[v.Name] = true
					if o.pvcs[v.PersistentVolumeClaim.ClaimName] == nil {
						t.Errorf("%s: volume %s: no claim %s", p.where, v.Name, v.PersistentVolumeClaim.ClaimName)
					}
				}
			}
			for _, c := range p.spec.Containers {
				for _, e := range c.Env {
					if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
						continue
					}
					ref := e.ValueFrom.SecretKeyRef
					if s := o.secrets[ref.Name]; s == nil {
						t.Errorf("%s: env %s: no Secret %s", p.where, e.Name, ref.Name)
					} else if _, ok := s.StringData[ref.Key]; !ok {
						t.Errorf("%s: env %s: Secret %s has no key %s", p.where, e.Name, ref.Name, ref.Key)
					}
				}
				for _, port := range c.Ports {
					for _, msg := range validation.IsValidPortName(port.Name) {
						t.Errorf("%s: port %s: %s", p.where, port.Name, msg)
					}
				}
				for what, probe := range map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
					if probe != nil && probe.HTTPGet != nil && !hasPort(c, probe.HTTPGet.Port.String()) {
						t.Errorf("%s container %s: %s probe on port %s, which the container does not declare", p.where, c.Name, what, probe.HTTPGet.Port.String())
					}
				}
			}
		}
		for n, s := range o.statefulSets {
			svc := o.services[s.Spec.ServiceName]
			if svc == nil || svc.Spec.ClusterIP != corev1.ClusterIPNone {
				t.Errorf("StatefulSet %s: serviceName %s is not a headless Service: its pods would have no stable DNS names", n, s.Spec.ServiceName)
			}
		}
		for n, svc := range o.services {
			pods := podsSelectedBy(o, svc.Spec.Selector)
			if len(pods) == 0 {
				t.Errorf("Service %s selects no pods (selector %v)", n, svc.Spec.Selector)
			}
			for _, sp := range svc.Spec.Ports {
				for _, p := range pods {
					if !slices.ContainsFunc(p.spec.Containers, func(c corev1.Container) bool { return hasPort(c, sp.TargetPort.String()) }) {
						t.Errorf("Service %s port %s: %s has no container port %s", n, sp.Name, p.where, sp.TargetPort.String())
					}
				}
			}
		}
	})
}

// hasPort reports whether c declares port, by name or number.
func hasPort(c corev1.Container, port string) bool {
	return slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool {
		return p.Name == port || fmt.Sprint(p.ContainerPort) == port
	})
}

func podsSelectedBy(o *objects, sel map[string]string) []pod {
	var out []pod
	for _, p := range o.pods() {
		match := len(sel) > 0
		for k, v := range sel {
			if p.labels[k] != v {
				match = false
			}
		}
		if match {
			out = append(out, p)
		}
	}
	return out
}

// mountedFile returns the content of path as a container sees it, when a
// ConfigMap or Secret volume mounted in the container holds it.
func mountedFile(t *testing.T, o *objects, p pod, c corev1.Container, path string) (string, bool) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		rel, err := filepath.Rel(m.MountPath, path)
		if err != nil || strings.HasPrefix(rel, "..") {
			continue
		}
		for _, v := range p.spec.Volumes {
			if v.Name != m.Name {
				continue
			}
			switch {
			case v.ConfigMap != nil && o.configMaps[v.ConfigMap.Name] != nil:
				s, ok := o.configMaps[v.ConfigMap.Name].Data[rel]
				return s, ok
			case v.Secret != nil && o.secrets[v.Secret.SecretName] != nil:
				key := rel
				for _, it := range v.Secret.Items {
					if it.Path == rel {
						key = it.Key
					}
				}
				s, ok := o.secrets[v.Secret.SecretName].StringData[key]
				return s, ok
			}
		}
	}
	return "", false
}

// containerEnv is the environment a container starts with: values, Secret
// keys and the pod's name.
func containerEnv(t *testing.T, o *objects, p pod, c corev1.Container) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			if s := o.secrets[e.ValueFrom.SecretKeyRef.Name]; s != nil {
				env[e.Name] = s.StringData[e.ValueFrom.SecretKeyRef.Key]
			}
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			env[e.Name] = p.name
		default:
			t.Errorf("%s: env %s: a source this check does not know", p.where, e.Name)
		}
	}
	return env
}

// writeTemp writes content to a file named name in a new directory.
func writeTemp(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestManifests_ContainersRunBuiltBinaries checks that every container of
// the gymfleet image runs a binary `make build` puts in it (deploy/Dockerfile
// copies bin/), or the image's shell.
func TestManifests_ContainersRunBuiltBinaries(t *testing.T) {
	makefile, err := os.ReadFile(filepath.Join(repoRoot(t), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	var built []string
	for _, line := range strings.Split(string(makefile), "\n") {
		if rest, ok := strings.CutPrefix(line, "CMDS"); ok {
			built = strings.Fields(strings.TrimLeft(rest, " :="))
		}
	}
	if len(built) == 0 {
		t.Fatal("no CMDS line in the Makefile")
	}
	for _, dir := range kustomizations {
		o := render(t, dir)
		for _, p := range o.pods() {
			for _, c := range p.spec.Containers {
				if !strings.HasPrefix(c.Image, "gymfleet:") {
					continue
				}
				if len(c.Command) == 0 || !(slices.Contains(built, c.Command[0]) || c.Command[0] == "/bin/sh") {
					t.Errorf("%s: %s container %s runs %v: want one of %v", dir, p.where, c.Name, c.Command, built)
				}
			}
		}
	}
}

// TestManifests_ShellScriptsPassShellcheck lints every `/bin/sh -c` script
// of every container with shellcheck (make test-deploy installs it).
func TestManifests_ShellScriptsPassShellcheck(t *testing.T) {
	if _, err := exec.LookPath("shellcheck"); err != nil {
		t.Fatal("shellcheck is not installed: make test-deploy installs it")
	}
	o := render(t, "base")
	n := 0
	for _, p := range o.pods() {
		for _, c := range append(append([]corev1.Container{}, p.spec.InitContainers...), p.spec.Containers...) {
			if len(c.Command) != 2 || c.Command[0] != "/bin/sh" || c.Command[1] != "-c" || len(c.Args) != 1 {
				continue
			}
			n++
			cmd := exec.Command("shellcheck", "--shell=sh", "-")
			cmd.Stdin = strings.NewReader(c.Args[0])
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("%s container %s: shellcheck: %v\n%s", p.where, c.Name, err, out)
			}
		}
	}
	if n == 0 {
		t.Error("no /bin/sh -c script found: the check checked nothing")
	}
}
