// planted kernel orphan
