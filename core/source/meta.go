package source

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Meta is what a record keeps of its object's metadata: the namespace and
// name that identify it and the resource version that tells its versions
// apart.
//
// Meta implements metav1.Object, so that client-go's informers and stores,
// which key objects by namespace and name and read their resource
// versions, hold records as they hold objects. The other fields read as
// unset, and setting them does nothing.
type Meta struct {
	Namespace       string
	Name            string
	ResourceVersion string
}

var _ metav1.Object = (*Meta)(nil)

// GetNamespace returns the namespace.
func (m *Meta) GetNamespace() string { return m.Namespace }

// SetNamespace sets the namespace.
func (m *Meta) SetNamespace(v string) { m.Namespace = v }

// GetName returns the name.
func (m *Meta) GetName() string { return m.Name }

// SetName sets the name.
func (m *Meta) SetName(v string) { m.Name = v }

// GetResourceVersion returns the resource version.
func (m *Meta) GetResourceVersion() string { return m.ResourceVersion }

// SetResourceVersion sets the resource version.
func (m *Meta) SetResourceVersion(v string) { m.ResourceVersion = v }

// GetGenerateName returns "": a record does not keep it.
func (m *Meta) GetGenerateName() string { return "" }

// SetGenerateName does nothing: a record does not keep it.
func (m *Meta) SetGenerateName(string) {}

// GetUID returns "": a record does not keep it.
func (m *Meta) GetUID() types.UID { return "" }

// SetUID does nothing: a record does not keep it.
func (m *Meta) SetUID(types.UID) {}

// GetGeneration returns 0: a record does not keep it.
func (m *Meta) GetGeneration() int64 { return 0 }

// SetGeneration does nothing: a record does not keep it.
func (m *Meta) SetGeneration(int64) {}

// GetSelfLink returns "": a record does not keep it.
func (m *Meta) GetSelfLink() string { return "" }

// SetSelfLink does nothing: a record does not keep it.
func (m *Meta) SetSelfLink(string) {}

// GetCreationTimestamp returns the zero time: Meta does not keep it.
func (m *Meta) GetCreationTimestamp() metav1.Time { return metav1.Time{} }

// SetCreationTimestamp does nothing: Meta does not keep it.
func (m *Meta) SetCreationTimestamp(metav1.Time) {}

// GetDeletionTimestamp returns nil: Meta does not keep it.
func (m *Meta) GetDeletionTimestamp() *metav1.Time { return nil }

// SetDeletionTimestamp does nothing: Meta does not keep it.
func (m *Meta) SetDeletionTimestamp(*metav1.Time) {}

// GetDeletionGracePeriodSeconds returns nil: a record does not keep it.
func (m *Meta) GetDeletionGracePeriodSeconds() *int64 { return nil }

// SetDeletionGracePeriodSeconds does nothing: a record does not keep it.
func (m *Meta) SetDeletionGracePeriodSeconds(*int64) {}

// GetLabels returns nil: Meta does not keep them.
func (m *Meta) GetLabels() map[string]string { return nil }

// SetLabels does nothing: Meta does not keep them.
func (m *Meta) SetLabels(map[string]string) {}

// GetAnnotations returns nil: Meta does not keep them.
func (m *Meta) GetAnnotations() map[string]string { return nil }

// SetAnnotations does nothing: Meta does not keep them.
func (m *Meta) SetAnnotations(map[string]string) {}

// GetFinalizers returns nil: a record does not keep them.
func (m *Meta) GetFinalizers() []string { return nil }

// SetFinalizers does nothing: a record does not keep them.
func (m *Meta) SetFinalizers([]string) {}

// GetOwnerReferences returns nil: a record does not keep them.
func (m *Meta) GetOwnerReferences() []metav1.OwnerReference { return nil }

// SetOwnerReferences does nothing: a record does not keep them.
func (m *Meta) SetOwnerReferences([]metav1.OwnerReference) {}

// GetManagedFields returns nil: a record does not keep them.
func (m *Meta) GetManagedFields() []metav1.ManagedFieldsEntry { return nil }

// SetManagedFields does nothing: a record does not keep them.
func (m *Meta) SetManagedFields([]metav1.ManagedFieldsEntry) {}
