// planted: a source outside the folders of its role
